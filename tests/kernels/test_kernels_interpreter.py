"""Every Triton kernel against its torch reference on CPU, through Triton's interpreter, at small
shapes. (bf16 `tl.dot` is not emulated by the interpreter, so attention and MoE use fp32/fp16
here; the gpu tier covers bf16.)"""
from __future__ import annotations

import pytest
import torch
from tests.kernels import kernel_cases as kc

from radixserve_kernels.decode_attention import SHAPES_16BIT, DecodeShape

pytestmark = kc.interpreter_only
ELEMENTWISE = [torch.float32, torch.bfloat16]
MATMUL = [torch.float32, torch.float16]
FP8 = torch.float8_e4m3fn

# The interpreter takes seconds a launch, so the cases below cover every pair of two factors,
# not their whole product: each shape meets every (q dtype, cache dtype) pair and every head
# layout (the gpu tier runs the launcher's shapes at every dtype, both caches, two layouts).
CACHE_PAIRS = [(torch.float32, None), (torch.float16, FP8), (torch.float32, FP8),
               (torch.float16, None)]
SLICED = [DecodeShape(32, 2, 2, True), DecodeShape(64, 2, 2, True), DecodeShape(16, 1, 1, True)]
HEAD_LAYOUTS = [((4, 2), 16), ((4, 2), 24), ((8, 2), 16), ((6, 2), 16)]


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_rmsnorm(dtype: torch.dtype) -> None:
    kc.check_rmsnorm("cpu", dtype, rows=5, dim=48)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_silu_and_mul(dtype: torch.dtype) -> None:
    kc.check_silu_and_mul("cpu", dtype, rows=4, inter=40)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_argmax_rows(dtype: torch.dtype) -> None:
    kc.check_argmax_rows("cpu", dtype, rows=6, cols=1000, chunk=128)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_rotary_default_and_llama3_frequencies(dtype: torch.dtype) -> None:
    plain = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    llama3 = plain.clone()
    llama3[8:] /= 8  # low frequencies scaled down, as llama3 scaling does
    for inv_freq in (plain, llama3):
        kc.check_rotary("cpu", dtype, tokens=6, heads=(4, 2), dim=32, inv_freq=inv_freq)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_qk_norm_rope_in_place(dtype: torch.dtype) -> None:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    kc.check_qk_norm_rope("cpu", dtype, tokens=5, heads=(4, 2), dim=32, inv_freq=inv_freq)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_qk_norm_rope_stores_kv(dtype: torch.dtype) -> None:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    kc.check_qk_norm_rope_store_kv("cpu", dtype, tokens=6, heads=(4, 2), dim=32, inv_freq=inv_freq)


@pytest.mark.parametrize("dtype", MATMUL)
def test_skinny_gemm(dtype: torch.dtype) -> None:
    kc.check_skinny_gemm("cpu", dtype, rows=[1, 3, 16], n=40, k=300)
    kc.check_skinny_gemm("cpu", dtype, rows=[1], n=42, k=2100)  # one row: masked tails, K > 2048


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_mul_gemv(dtype: torch.dtype) -> None:
    kc.check_silu_mul_gemv("cpu", dtype, n=42, k=300)
    kc.check_silu_mul_gemv("cpu", dtype, n=10, k=2100)  # K > 2048: the long-row config, masked tail


# each scale layout once, each weight read (pointers, TMA tiles) and dtype twice
@pytest.mark.fast_cases("pointers-row-dtype1", "tma-128x128-dtype0", "tma-32x16-dtype1", "pointers-1x128-dtype0")
@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("block", [None, (128, 128), (32, 16), (1, 128)],
                         ids=["row", "128x128", "32x16", "1x128"])
@pytest.mark.parametrize("k", [300, 320], ids=["pointers", "tma"])
def test_fp8_gemm(dtype: torch.dtype, block: tuple[int, int] | None, k: int) -> None:
    # ragged N and K against every scale layout (the layers' is (1, block_k)); 20 rows: tiled.
    # One row reads the weight through pointers where its rows are not 16-byte aligned (300),
    # else as TMA tiles, whose rows and columns past the edge must read as zeros
    kc.check_fp8_gemm("cpu", dtype, rows=[1, 3, 16, 20], n=130, k=k, block=block)


def test_fp8_one_row_weight_read_as_tma_tiles_where_rows_are_aligned() -> None:
    from radixserve_kernels.fp8_gemv import FP8_WEIGHT_DTYPE, weight_tiles

    aligned = torch.zeros(130, 320, dtype=FP8_WEIGHT_DTYPE)
    desc = weight_tiles(aligned, 16, 512)
    assert desc is not aligned and desc.block_shape == [16, 512] and desc.base is aligned
    unaligned = torch.zeros(130, 300, dtype=FP8_WEIGHT_DTYPE)
    assert weight_tiles(unaligned, 16, 512) is unaligned


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantize_groups_fp8(dtype: torch.dtype) -> None:
    kc.check_quantize_groups_fp8("cpu", dtype, rows=5, k=384, pad=3)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_store_kv(dtype: torch.dtype) -> None:
    kc.check_store_kv("cpu", dtype, tokens=7, heads=2, dim=16)


@pytest.mark.fast_cases("16-1-dtype0", "24-4-dtype1")  # each dtype, each half-filling of head_dim
@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("dim", [16, 24])  # the kernel dots head_dim in halves: 24 fills 1.5
def test_decode_attention(dtype: torch.dtype, page: int, dim: int) -> None:
    kc.check_decode("cpu", dtype, [1, 37, 70], heads=(4, 2), dim=dim, page=page, splits=[None, 1, 3])


# the interpreter runs a shape's key block alone (warps and stages are the compiler's):
# test_decode_attention takes 32 (float16) and 128 (float32), this one 64
@pytest.mark.fast_cases("64x4d3")
@pytest.mark.parametrize("shape", sorted(set(SHAPES_16BIT.values())), ids=kc.case_id)
def test_decode_attention_every_16_bit_shape(shape: DecodeShape) -> None:
    """Each launch shape the launcher picks for a 16-bit cache at some batch size, with keys
    ending mid-block and across several blocks."""
    kc.check_decode("cpu", torch.float16, [1, 37, 130], heads=(4, 2), dim=32, page=4,
                    splits=[None, 3], shape=shape)


@pytest.mark.fast_cases("split-f32")  # the others take 40 s to 4 min each on a 2-core machine
@pytest.mark.parametrize("shape,dtype,kv_dtype", [
    (shape, *CACHE_PAIRS[i + 2 * j]) for j, shape in enumerate([None, DecodeShape(32, 2, 2, True)])
    for i in range(2)],
    ids=["split-f32", "split-f16-fp8", "sliced-f32-fp8", "sliced-f16"])
def test_decode_attention_rotates_and_stores_the_new_token(dtype, kv_dtype, shape) -> None:
    """One-key requests (the new token alone), keys ending mid-block, and 3 splits, where
    only the last holds the new token."""
    kc.check_decode_rope("cpu", dtype, [1, 37, 70], heads=(4, 2), dim=32, splits=[None, 1, 3],
                         kv_dtype=kv_dtype, shape=shape)


def test_decode_attention_refuses_heads_it_cannot_rotate() -> None:
    from radixserve_kernels import NewTokenKV, RopeParams, decode_attention, decode_rope_fusable

    assert decode_rope_fusable(64) and decode_rope_fusable(128) and not decode_rope_fusable(24)
    q, kcache = torch.zeros(1, 2, 24), torch.zeros(4, 1, 24)
    new = NewTokenKV(torch.zeros(1, 1, 24), torch.zeros(1, 1, 24), torch.zeros(1, dtype=torch.long),
                     RopeParams(torch.zeros(8, 24)))
    with pytest.raises(ValueError, match="cannot rotate heads of 24"):
        decode_attention(q, kcache, kcache.clone(), torch.zeros(1, 4, dtype=torch.int32),
                         torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.int32), 1.0,
                         new_kv=new)


@pytest.mark.parametrize("sliced", [False, True])
def test_decode_programs_follow_the_launch_order(sliced: bool) -> None:
    """The kernels compute request `order[rank]` at each rank: an order naming request 1 alone
    writes request 1's output and leaves the others' rows as they were (the longest-first order
    of the launcher changes nothing but the time only because the kernels follow it)."""
    from radixserve_kernels import decode_attention, decode_attention_ref

    gen = torch.Generator().manual_seed(5)
    seq_lens = [9, 40, 17]
    table, rows = kc.paged_table(seq_lens, 1, sum(seq_lens) + 3, 48, gen)
    kcache, vcache = kc.kv_pool(sum(seq_lens) + 3, 1, 2, 16, torch.float32, gen)
    q = torch.randn(3, 4, 16, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    shape = DecodeShape(32, 2, 2, True) if sliced else DecodeShape(32, 2, 4, False)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kcache, vcache, table, rows, lens, 0.25, num_splits=1, out=out, shape=shape,
                     order=torch.ones(3, dtype=torch.int64))
    want = decode_attention_ref(q, kcache, vcache, table, rows, lens, 0.25)
    torch.testing.assert_close(out[1], want[1], rtol=1e-4, atol=1e-4)
    assert out[[0, 2]].isnan().all()


@pytest.mark.fast_cases("1-dtype0", "4-dtype1")
@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("page", [1, 4])
def test_extend_attention(dtype: torch.dtype, page: int) -> None:
    kc.check_extend("cpu", dtype, prefix_lens=[0, 9, 70], extend_lens=[5, 1, 66], heads=(4, 2),
                    dim=16, page=page)


@pytest.mark.parametrize("dtype", MATMUL)
def test_moe(dtype: torch.dtype) -> None:
    kc.check_moe("cpu", dtype, tokens=9, hidden=32, inter=16, experts=6, top_k=2)


@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("parts", [(0, 48), (0, 32, 40, 48), (0, 24, 48)], ids=["1", "qkv", "2"])
def test_lora_shrink_expand(dtype: torch.dtype, parts: tuple[int, ...]) -> None:
    kc.check_lora("cpu", dtype, tokens=21, hidden=40, parts=parts, rank=8, slots=3)


@pytest.mark.parametrize("dtype", MATMUL)
def test_lora_shrink_split_k(dtype: torch.dtype) -> None:
    # an input wide enough that the shrink leaves split partials for the expand to sum, and
    # one slot's tokens over several tiles (slot 1 is left empty: slot 0 holds about half)
    kc.check_lora("cpu", dtype, tokens=37, hidden=8300, parts=(0, 16), rank=16, slots=2)


@pytest.mark.parametrize("dtype", [torch.float16])  # (16-bit: a one-row GEMV's types)
@pytest.mark.parametrize("hidden, parts, gated", [(300, (0, 24, 32, 40), False),
                                                  (600, (0, 30), True)])  # (2 shrink planes)
def test_lora_gemv(dtype: torch.dtype, hidden: int, parts: tuple[int, ...], gated: bool) -> None:
    kc.check_lora_gemv("cpu", dtype, hidden=hidden, parts=parts, rank=8, slots=3, gated=gated)


def test_page_indices() -> None:
    kc.check_page_indices("cpu", [1, 16, 17, 40], page=16)


# ---- the FP8 KV cache: stores exact (the interpreter's e4m3 rounding is replaced by torch's, as
# `radixserve_kernels.testing` explains), attention within the 16/32-bit tolerances -----------


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_store_kv_fp8(dtype: torch.dtype) -> None:
    kc.check_store_kv_fp8("cpu", dtype, tokens=7, heads=2, dim=16)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_qk_norm_rope_stores_fp8_kv(dtype: torch.dtype) -> None:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    kc.check_qk_norm_rope_store_kv("cpu", dtype, tokens=6, heads=(4, 2), dim=32,
                                   inv_freq=inv_freq, cache_dtype=FP8)


# (float32 q over an FP8 cache: test_triton_backend_interp's FP8 decode case)
@pytest.mark.fast_cases("24-4-dtype1")
@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("dim", [16, 24])
def test_decode_attention_fp8_kv(dtype: torch.dtype, page: int, dim: int) -> None:
    kc.check_decode("cpu", dtype, [1, 37, 70], heads=(4, 2), dim=dim, page=page,
                    splits=[None, 1, 3], kv_dtype=FP8)


# both slice counts, group 3 (not a power of two), head_dim 24, each q dtype (the sliced kernel
# over a 16-bit cache: test_decode_programs_follow_the_launch_order, the windowed tests)
@pytest.mark.fast_cases("16x1sd1-6-2-16-float16-float8_e4m3fn",
                        "64x2sd2-4-2-24-float32-float8_e4m3fn")
@pytest.mark.parametrize("shape,heads,dim,dtype,kv_dtype", [
    (shape, *HEAD_LAYOUTS[h], *CACHE_PAIRS[(h + i) % 4])
    for i, shape in enumerate(SLICED) for h in range(len(HEAD_LAYOUTS))], ids=kc.case_id)
def test_decode_attention_sliced(dtype: torch.dtype, kv_dtype: torch.dtype | None,
                                 heads: tuple[int, int], dim: int, shape: DecodeShape) -> None:
    """The sliced kernel (each warp its own slice of every key block), which the launcher picks
    only for a 16-bit q over FP8 at 16+ requests, at any size here: a 1-key request leaves
    slices with no key at all, 70 keys end mid-slice, groups 4 and 3 fill more rows (3 is not a
    power of two: SmolLM2's 9 query heads over 3 KV heads)."""
    kc.check_decode("cpu", dtype, [1, 37, 70], heads=heads, dim=dim, page=4, splits=[None, 1, 3],
                    kv_dtype=kv_dtype, shape=shape)


FP8_QK_SHAPES = [DecodeShape(32, 2, 2, True, True), DecodeShape(16, 1, 1, True, True)]


# (2 slices, group 2: test_fp8_qk_split_is_exact_for_any_magnitude_of_q)
@pytest.mark.fast_cases("16x1-group3")
@pytest.mark.parametrize("heads", [(4, 2), (6, 2)], ids=["group2", "group3"])
@pytest.mark.parametrize("shape", FP8_QK_SHAPES, ids=["32x2", "16x1"])
def test_decode_attention_fp8_qk(heads: tuple[int, int], shape: DecodeShape) -> None:
    """The sliced kernel's QK dots reading the FP8 keys as they are, against q split into two
    e4m3 parts: the reference's numbers within bf16's tolerance, at a 1-key request (slices
    with no key), 70 keys ending mid-slice, and a group of 3."""
    kc.check_decode("cpu", torch.bfloat16, [1, 37, 70], heads=heads, dim=64, page=4,
                    splits=[None, 1, 3], kv_dtype=FP8, shape=shape)


def test_fp8_qk_split_is_exact_for_any_magnitude_of_q() -> None:
    """q heads from 1e-4 to 1e4 in size: each head's power-of-two scale and two e4m3 parts
    give the scores of the 16-bit dots (the same launch shape, keys widened), so the outputs
    agree to the last bit of bf16 but for rounding in a different order of sums."""
    from radixserve_kernels import decode_attention

    gen = torch.Generator().manual_seed(5)
    lens = [3, 40, 70]
    table, rows = kc.paged_table(lens, 4, 40, 72, gen)
    kcache, vcache = kc.kv_pool(40, 4, 2, 64, FP8, gen)
    size = 10.0 ** torch.linspace(-4, 4, 4)  # one magnitude per query head
    q = (torch.randn(3, 4, 64, generator=gen) * size[None, :, None]).to(torch.bfloat16)
    args = (q, kcache, vcache, table, rows, torch.tensor(lens, dtype=torch.int32), 0.125)
    fp8 = decode_attention(*args, num_splits=1, shape=DecodeShape(32, 2, 2, True, True))
    f16 = decode_attention(*args, num_splits=1, shape=DecodeShape(32, 2, 2, True, False))
    torch.testing.assert_close(fp8.float(), f16.float(), rtol=8e-3, atol=1e-5)
    assert not torch.equal(fp8, torch.zeros_like(fp8))


@pytest.mark.parametrize("q_dtype,kv_dtype", [(torch.float16, FP8), (torch.bfloat16, torch.bfloat16)])
def test_fp8_qk_shape_refused_where_it_cannot_run(q_dtype: torch.dtype,
                                                  kv_dtype: torch.dtype) -> None:
    """An explicit FP8-key shape needs a bf16 q (float16's 11 bits do not split into two e4m3
    parts) and an e4m3 cache: anything else is a clear error before any launch."""
    from radixserve_kernels import decode_attention

    gen = torch.Generator().manual_seed(1)
    table, rows = kc.paged_table([5], 4, 4, 8, gen)
    kcache, vcache = kc.kv_pool(4, 4, 2, 64, kv_dtype, gen)
    q = torch.randn(1, 4, 64, generator=gen).to(q_dtype)
    with pytest.raises(ValueError, match="FP8 QK dots need"):
        decode_attention(q, kcache, vcache, table, rows, torch.tensor([5], dtype=torch.int32),
                         0.125, shape=DecodeShape(32, 2, 2, True, True))


@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("page", [1, 4])
def test_extend_attention_fp8_kv(dtype: torch.dtype, page: int) -> None:
    kc.check_extend("cpu", dtype, prefix_lens=[0, 9, 70], extend_lens=[5, 1, 66], heads=(4, 2),
                    dim=16, page=page, kv_dtype=FP8)
