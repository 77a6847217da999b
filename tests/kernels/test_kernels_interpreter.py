"""Every Triton kernel against its torch reference on CPU, through Triton's interpreter, at small
shapes. (bf16 `tl.dot` is not emulated by the interpreter, so attention and MoE use fp32/fp16
here; the gpu tier covers bf16.)"""
from __future__ import annotations

import pytest
import torch
from tests.kernels import kernel_cases as kc

from radixserve_kernels.decode_attention import DecodeShape

pytestmark = kc.interpreter_only
ELEMENTWISE = [torch.float32, torch.bfloat16]
MATMUL = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_rmsnorm(dtype: torch.dtype) -> None:
    kc.check_rmsnorm("cpu", dtype, rows=5, dim=48)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_silu_and_mul(dtype: torch.dtype) -> None:
    kc.check_silu_and_mul("cpu", dtype, rows=4, inter=40)


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


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_store_kv(dtype: torch.dtype) -> None:
    kc.check_store_kv("cpu", dtype, tokens=7, heads=2, dim=16)


@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("dim", [16, 24])  # the kernel dots head_dim in halves: 24 fills 1.5
def test_decode_attention(dtype: torch.dtype, page: int, dim: int) -> None:
    kc.check_decode("cpu", dtype, [1, 37, 70], heads=(4, 2), dim=dim, page=page, splits=[None, 1, 3])


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


@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("page", [1, 4])
def test_extend_attention(dtype: torch.dtype, page: int) -> None:
    kc.check_extend("cpu", dtype, prefix_lens=[0, 9, 70], extend_lens=[5, 1, 66], heads=(4, 2),
                    dim=16, page=page)


@pytest.mark.parametrize("dtype", MATMUL)
def test_moe(dtype: torch.dtype) -> None:
    kc.check_moe("cpu", dtype, tokens=9, hidden=32, inter=16, experts=6, top_k=2)


def test_page_indices() -> None:
    kc.check_page_indices("cpu", [1, 16, 17, 40], page=16)


# ---- the FP8 KV cache: stores exact (the interpreter's e4m3 rounding is replaced by torch's, as
# `radixserve_kernels.testing` explains), attention within the 16/32-bit tolerances -----------
FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_store_kv_fp8(dtype: torch.dtype) -> None:
    kc.check_store_kv_fp8("cpu", dtype, tokens=7, heads=2, dim=16)


@pytest.mark.parametrize("dtype", ELEMENTWISE)
def test_qk_norm_rope_stores_fp8_kv(dtype: torch.dtype) -> None:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    kc.check_qk_norm_rope_store_kv("cpu", dtype, tokens=6, heads=(4, 2), dim=32,
                                   inv_freq=inv_freq, cache_dtype=FP8)


@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("dim", [16, 24])
def test_decode_attention_fp8_kv(dtype: torch.dtype, page: int, dim: int) -> None:
    kc.check_decode("cpu", dtype, [1, 37, 70], heads=(4, 2), dim=dim, page=page,
                    splits=[None, 1, 3], kv_dtype=FP8)


@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("kv_dtype", [None, FP8])
@pytest.mark.parametrize("heads,dim", [((4, 2), 16), ((4, 2), 24), ((8, 2), 16), ((6, 2), 16)])
@pytest.mark.parametrize("shape", [DecodeShape(32, 2, 2, True), DecodeShape(64, 2, 2, True),
                                   DecodeShape(16, 1, 1, True)], ids=["32x2", "64x2", "16x1"])
def test_decode_attention_sliced(dtype: torch.dtype, kv_dtype: torch.dtype | None,
                                 heads: tuple[int, int], dim: int, shape: DecodeShape) -> None:
    """The sliced kernel (each warp its own slice of every key block), which the launcher picks
    only for a 16-bit q over FP8 at 16+ requests, at any size here: a 1-key request leaves
    slices with no key at all, 70 keys end mid-slice, groups 4 and 3 fill more rows (3 is not a
    power of two: SmolLM2's 9 query heads over 3 KV heads)."""
    kc.check_decode("cpu", dtype, [1, 37, 70], heads=heads, dim=dim, page=4, splits=[None, 1, 3],
                    kv_dtype=kv_dtype, shape=shape)


@pytest.mark.parametrize("dtype", MATMUL)
@pytest.mark.parametrize("page", [1, 4])
def test_extend_attention_fp8_kv(dtype: torch.dtype, page: int) -> None:
    kc.check_extend("cpu", dtype, prefix_lens=[0, 9, 70], extend_lens=[5, 1, 66], heads=(4, 2),
                    dim=16, page=page, kv_dtype=FP8)
