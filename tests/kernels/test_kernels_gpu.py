"""Every Triton kernel against its torch reference on CUDA at realistic shapes (GQA 16/8 and
32/8, head_dim 64/128, page sizes 1/16/64, batches up to 256, sequences up to 2k), the attention
kernels with sliding windows too."""
from __future__ import annotations

import pytest
import torch
from tests.kernels import kernel_cases as kc

from radixserve_kernels.decode_attention import DecodeShape

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [128, 1024, 4096])
def test_rmsnorm(dtype: torch.dtype, dim: int) -> None:
    kc.check_rmsnorm("cuda", dtype, rows=300, dim=dim)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype: torch.dtype) -> None:
    kc.check_silu_and_mul("cuda", dtype, rows=257, inter=3072)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float16])
@pytest.mark.parametrize("rows", [5, 256])
def test_argmax_rows_qwen_vocab(dtype: torch.dtype, rows: int) -> None:
    from radixserve_kernels.argmax import ARGMAX_CHUNK

    kc.check_argmax_rows("cuda", dtype, rows=rows, cols=151_936, chunk=ARGMAX_CHUNK)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [64, 128])
def test_rotary_default_and_llama3(dtype: torch.dtype, dim: int) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    for params in ({"rope_type": "default", "rope_theta": 1e6}, llama3):
        cfg = LlamaConfig(hidden_size=16 * dim, num_attention_heads=16, rope_parameters=params)
        inv_freq = LlamaRotaryEmbedding(cfg).inv_freq
        kc.check_rotary("cuda", dtype, tokens=513, heads=(16, 8), dim=dim, inv_freq=inv_freq)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((32, 8), 64), ((9, 3), 64)])
def test_qk_norm_rope_in_place(dtype: torch.dtype, heads: tuple[int, int], dim: int) -> None:
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, dim, 2).float() / dim))
    kc.check_qk_norm_rope("cuda", dtype, tokens=300, heads=heads, dim=dim, inv_freq=inv_freq)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((9, 3), 64)])
def test_qk_norm_rope_stores_kv(dtype: torch.dtype, heads: tuple[int, int], dim: int) -> None:
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, dim, 2).float() / dim))
    kc.check_qk_norm_rope_store_kv("cuda", dtype, tokens=300, heads=heads, dim=dim, inv_freq=inv_freq)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (100, 70)])
def test_skinny_gemm_qwen3_shapes(dtype: torch.dtype, n: int, k: int) -> None:
    kc.check_skinny_gemm("cuda", dtype, rows=list(range(1, 17)), n=n, k=k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(1024, 3072), (2560, 9728), (4096, 12288), (100, 70)], ids=kc.case_id)
def test_silu_mul_gemv_down_projection_shapes(dtype: torch.dtype, n: int, k: int) -> None:
    # Qwen3-0.6B's, 4B's and 8B's down projections, and a ragged one
    kc.check_silu_mul_gemv("cuda", dtype, n=n, k=k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block", [None, (128, 128), (1, 128)], ids=["row", "128x128", "1x128"])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 12288), (1000, 1000), (1000, 1008)],
                         ids=kc.case_id)
def test_fp8_gemm_qwen3_8b_shapes(dtype: torch.dtype, block: tuple[int, int] | None, n: int,
                                  k: int) -> None:
    # Qwen3-8B's QKV and down projections, and ragged ones (one row: read through pointers where
    # rows are not 16-byte aligned, else by TMA tiles that overhang the edges); one-row, skinny
    # and tiled kernels
    kc.check_fp8_gemm("cuda", dtype, rows=[1, 2, 3, 8, 13, 16, 64, 300], n=n, k=k, block=block)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 12288), (256, 512)], ids=kc.case_id)
def test_blockwise_fp8_gemm_qwen3_8b_shapes(dtype: torch.dtype, n: int, k: int) -> None:
    # Qwen3-8B's QKV and down projections and a small one, at decode and prefill row counts
    from radixserve_kernels import blockwise_fits
    from radixserve_kernels._utils import fp8_blockwise_capable

    if not fp8_blockwise_capable(torch.cuda.current_device()):
        pytest.skip("cuBLASLt's block-scaled FP8 GEMM is taken on Hopper only")
    x, w = torch.empty(1, 384, device="cuda"), torch.empty(256, 384, device="cuda")
    assert not blockwise_fits(x, w, torch.empty(2, 3, device="cuda"), (128, 128))  # 3 K blocks
    kc.check_quantize_groups_fp8("cuda", dtype, rows=37, k=k, pad=3)
    kc.check_blockwise_fp8_gemm(dtype, rows=[2, 3, 16, 37, 64, 300], n=n, k=k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv(dtype: torch.dtype) -> None:
    kc.check_store_kv("cuda", dtype, tokens=1000, heads=8, dim=128)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((32, 8), 64)])
def test_decode_attention(dtype: torch.dtype, page: int, heads: tuple[int, int], dim: int) -> None:
    gen = torch.Generator().manual_seed(page)
    seq_lens = [1, 2, 2048] + torch.randint(1, 2048, (61,), generator=gen).tolist()
    kc.check_decode("cuda", dtype, seq_lens, heads, dim, page, splits=[None, 1, 16])
    kc.check_decode("cuda", dtype, [1500], heads, dim, page, splits=[None, 1])
    for n in (30, 100, 200):  # with 64 and one request above, every batch size's launch shape
        lens = torch.randint(1, 2048, (n,), generator=gen).tolist()
        kc.check_decode("cuda", dtype, lens, heads, dim, page, splits=[None, 2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((32, 8), 64)])
def test_extend_attention(dtype: torch.dtype, page: int, heads: tuple[int, int], dim: int) -> None:
    gen = torch.Generator().manual_seed(page + dim)
    prefix = [0, 0, 1500, 63, 700] + torch.randint(0, 1024, (11,), generator=gen).tolist()
    extend = [2048, 1, 300, 65, 1] + torch.randint(1, 512, (11,), generator=gen).tolist()
    kc.check_extend("cuda", dtype, prefix, extend, heads, dim, page)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 37, 1024])
def test_moe_qwen3_shapes(dtype: torch.dtype, tokens: int) -> None:
    # Qwen3-30B-A3B's expert shapes, fewer experts to keep memory small
    kc.check_moe("cuda", dtype, tokens=tokens, hidden=2048, inter=768, experts=32, top_k=8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 64, 1000])
@pytest.mark.parametrize("rank", [16, 256])
def test_lora_qwen3_8b_shapes(dtype: torch.dtype, tokens: int, rank: int) -> None:
    # Qwen3-8B's fused qkv (32 query and 8 KV heads of 128) and its down projection, 8 slots
    kc.check_lora("cuda", dtype, tokens, 4096, (0, 4096, 5120, 6144), rank, slots=8)
    kc.check_lora("cuda", dtype, tokens, 12288, (0, 4096), rank, slots=8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])  # (a one-row GEMV's types)
@pytest.mark.parametrize("rank", [16, 256])
def test_lora_gemv_qwen3_8b_shapes(dtype: torch.dtype, rank: int) -> None:
    # one row (decode at batch 1) through Qwen3-8B's fused qkv, gate-up and gated down projection
    kc.check_lora_gemv("cuda", dtype, 4096, (0, 4096, 5120, 6144), rank, slots=8, gated=False)
    kc.check_lora_gemv("cuda", dtype, 4096, (0, 12288, 24576), rank, slots=8, gated=False)
    kc.check_lora_gemv("cuda", dtype, 12288, (0, 4096), rank, slots=8, gated=True)


def test_lora_gemv_in_a_cuda_graph() -> None:
    """The one-row product with its update captured once, replayed as the row's slot changes
    (the base model's among them): each replay gives what the kernel gives outside the graph."""
    from radixserve_kernels import lora_gemv, lora_groups

    gen = torch.Generator().manual_seed(4)
    hidden, out, rank, slots = 2048, 1536, 16, 4
    x = torch.randn(1, 2 * hidden, generator=gen).bfloat16().cuda()
    w = (torch.randn(out, hidden, generator=gen) * hidden**-0.5).bfloat16().cuda()
    a = (torch.randn(slots, rank, hidden, generator=gen) * hidden**-0.5).bfloat16().cuda()
    b = torch.randn(slots, out, rank, generator=gen).bfloat16().cuda()
    slot = torch.zeros(1, dtype=torch.int32, device="cuda")
    y = torch.zeros(1, out, dtype=torch.bfloat16, device="cuda")

    def step() -> None:
        lora_gemv(x, w, None, a, b, lora_groups(slot, slots), (0, out), gated=True, out=y)

    graph = kc.captured(step)
    seen = []
    for s in (2, -1, 0, 3):
        slot.fill_(s)
        graph.replay()
        want = lora_gemv(x, w, None, a, b, lora_groups(slot, slots), (0, out), gated=True)
        assert torch.equal(y, want), s
        seen.append(y.clone())
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[0], seen[2])


def test_lora_in_a_cuda_graph() -> None:
    """The grouping and both kernels captured once, replayed over other adapters' tokens: what a
    decode graph does each step (the slots are gathered into a static buffer)."""
    from radixserve_kernels import lora_expand_, lora_expand_ref, lora_groups, lora_shrink

    gen = torch.Generator().manual_seed(3)
    t, hidden, out, rank, slots = 64, 1024, 768, 16, 8
    x = torch.randn(t, hidden, generator=gen).bfloat16().cuda()
    a = (torch.randn(slots, rank, hidden, generator=gen) * hidden**-0.5).bfloat16().cuda()
    b = torch.randn(slots, out, rank, generator=gen).bfloat16().cuda()
    token_slots = torch.full((t,), -1, dtype=torch.int32, device="cuda")
    y = torch.zeros(t, out, dtype=torch.bfloat16, device="cuda")

    def step() -> None:
        y.zero_()
        groups = lora_groups(token_slots, slots)
        lora_expand_(y, lora_shrink(x, a, groups), b, groups, (0, out))

    graph = kc.captured(step)
    for seed in range(3):
        token_slots.copy_(torch.randint(-1, slots, (t,), generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        groups = lora_groups(token_slots, slots)
        v = lora_shrink(x, a, groups).sum(0).bfloat16()  # (its splits' planes, summed)
        want = lora_expand_ref(torch.zeros_like(y), v, b, groups, (0, out))
        kc.close(y, want, torch.bfloat16, scale=4)
        assert (y[token_slots < 0] == 0).all()


@pytest.mark.parametrize("page", [1, 16, 64, 256])
def test_page_indices(page: int) -> None:
    kc.check_page_indices("cuda", [1, page, page + 1, 2048, 777], page)


# ---- the FP8 KV cache ------------------------------------------------------------------------
FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_dtype", [None, FP8], ids=["kv-model", "kv-fp8"])
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((32, 8), 64)])
def test_decode_attention_rotates_and_stores_the_new_token(
        dtype: torch.dtype, kv_dtype: torch.dtype | None, heads: tuple[int, int], dim: int) -> None:
    """The decode kernels given the new token raw, at the batch sizes of each launch shape (one
    request, 16 with splits, 100 and 256), over the model dtype's cache and FP8."""
    gen = torch.Generator().manual_seed(dim)
    for n in (1, 16, 100, 256):
        lens = [1500] if n == 1 else [1] + torch.randint(1, 2048, (n - 1,), generator=gen).tolist()
        kc.check_decode_rope("cuda", dtype, lens, heads, dim, splits=[None, 16],
                             kv_dtype=kv_dtype)


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((32, 8), 64)])
def test_windowed_attention(page: int, heads: tuple[int, int], dim: int) -> None:
    """Sliding windows under and over a key block: extend, both decode kernels with splits the
    window leaves empty, an FP8 cache and the fused new-token decode (float32 q)."""
    for window in (24, 100):
        kc.check_windowed_extend("cuda", page, window, heads, dim)
        for shape in (None, DecodeShape(64, 3, 2, True)):
            kc.check_windowed_decode("cuda", page, window, heads, dim, [1, 3, 16], shape)
    kc.check_windowed_extend("cuda", page, 24, heads, dim, kv_dtype=FP8)
    kc.check_windowed_decode("cuda", page, 24, heads, dim, [None, 3], kv_dtype=FP8)
    kc.check_windowed_decode_rope("cuda", 24, heads, dim)


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_fp8(dtype: torch.dtype) -> None:
    kc.check_store_kv_fp8("cuda", dtype, tokens=1000, heads=8, dim=128)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((9, 3), 64)])
def test_qk_norm_rope_stores_fp8_kv(dtype: torch.dtype, heads: tuple[int, int], dim: int) -> None:
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, dim, 2).float() / dim))
    kc.check_qk_norm_rope_store_kv("cuda", dtype, tokens=300, heads=heads, dim=dim,
                                   inv_freq=inv_freq, cache_dtype=FP8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((32, 8), 64)])
def test_decode_attention_fp8_kv(dtype: torch.dtype, page: int, heads: tuple[int, int],
                                 dim: int) -> None:
    gen = torch.Generator().manual_seed(page + 1)
    seq_lens = [1, 2, 2048] + torch.randint(1, 2048, (61,), generator=gen).tolist()
    kc.check_decode("cuda", dtype, seq_lens, heads, dim, page, splits=[None, 1, 16], kv_dtype=FP8)
    # under a bf16 q these batch sizes take the sliced kernel's shapes (100: 128's), the last two
    # with the FP8-key dots
    for n in (16, 100, 256):
        lens = torch.randint(1, 2048, (n,), generator=gen).tolist()
        kc.check_decode("cuda", dtype, lens, heads, dim, page, splits=[None, 2], kv_dtype=FP8)
    shapes = [DecodeShape(64, 3, 2, True), DecodeShape(128, 3, 4, False)]  # both kernels
    if dtype == torch.bfloat16:  # and the FP8-key dots
        shapes += [DecodeShape(32, 3, 1, True, True), DecodeShape(64, 3, 2, True, True)]
    for shape in shapes:
        kc.check_decode("cuda", dtype, seq_lens, heads, dim, page, splits=[None, 1, 16],
                        kv_dtype=FP8, shape=shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads,dim", [((16, 8), 128), ((32, 8), 64)])
def test_extend_attention_fp8_kv(dtype: torch.dtype, page: int, heads: tuple[int, int],
                                 dim: int) -> None:
    gen = torch.Generator().manual_seed(page + dim + 1)
    prefix = [0, 0, 1500, 63, 700] + torch.randint(0, 1024, (11,), generator=gen).tolist()
    extend = [2048, 1, 300, 65, 1] + torch.randint(1, 512, (11,), generator=gen).tolist()
    kc.check_extend("cuda", dtype, prefix, extend, heads, dim, page, kv_dtype=FP8)
