"""The triton and flashinfer backends (and hybrids of them) against the torch reference backend
on CUDA: prefill, extend over a cached prefix, decode, and decode replayed from a CUDA graph.

Tolerances: float32 1e-4 (FlashInfer has no fp32 kernels; its backend runs Triton's there);
bfloat16 2e-2 absolute on outputs of magnitude ~1 (two bf16 ulps)."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
from tests.kernels.kernel_cases import backend_case, run_backend

pytestmark = pytest.mark.gpu
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
SPECS = [
    "triton",
    pytest.param("flashinfer", marks=pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")),
    pytest.param("flashinfer,triton", marks=pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")),
    pytest.param("triton,flashinfer", marks=pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")),
]
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
PREFILL = ([0, 0, 0], [7, 300, 1024])
EXTEND = ([17, 1000, 64, 5], [1, 40, 64, 700])
DECODE = ([0, 1, 15, 16, 63, 700, 1499, 2047], [1] * 8)


def _compare(spec: str, dtype: torch.dtype, page: int, lens, heads, dim,
             kv_stored: bool = False, kv_dtype: torch.dtype | None = None,
             q_in_qkv: bool = False) -> None:
    """`q_in_qkv`: the backend gets q as the model hands it, a view of the qkv projection's
    rows (row stride (Hq + 2 Hkv) * D), the reference a contiguous copy."""
    from radixserve.attention import create_attn_backend
    from radixserve.attention.torch_backend import TorchBackend

    cfg, batch, q, k, v = backend_case("cuda", dtype, page, *lens, heads, dim, seed=page,
                                       kv_dtype=kv_dtype)
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v)
    if q_in_qkv:
        q = torch.cat([q, k, v], dim=1)[:, : q.shape[1]]
        assert not q.is_contiguous() and q.stride(0) == (heads[0] + 2 * heads[1]) * dim
    got = run_backend(create_attn_backend(spec, cfg), batch, q, k, v, kv_stored=kv_stored)
    for g, w in zip(got, want):
        assert g.dtype == q.dtype and g.shape == q.shape
        torch.testing.assert_close(g.float(), w.float(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("lens", [PREFILL, EXTEND, DECODE], ids=["prefill", "extend", "decode"])
def test_backend_matches_torch(spec: str, dtype: torch.dtype, page: int, lens) -> None:
    _compare(spec, dtype, page, lens, (16, 8), 128)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("lens", [EXTEND, DECODE], ids=["extend", "decode"])
def test_backend_gqa4_head_dim_64(spec: str, lens) -> None:
    _compare(spec, torch.bfloat16, 16, lens, (32, 8), 64)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens", [EXTEND, DECODE], ids=["extend", "decode"])
def test_backend_attends_over_kv_already_stored(spec: str, dtype: torch.dtype, lens) -> None:
    """forward(q, None, None): the new k/v were stored beforehand, as the fused rotary does."""
    _compare(spec, dtype, 16, lens, (16, 8), 128, kv_stored=True)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["kv-bf16", "kv-fp8"])
@pytest.mark.parametrize("lens", [PREFILL, EXTEND, DECODE], ids=["prefill", "extend", "decode"])
def test_backend_reads_q_where_the_qkv_projection_left_it(spec: str, kv_dtype, lens) -> None:
    """The fused rotary kernel leaves q inside the qkv projection's output; every backend reads it
    there (FlashInfer through its row and head strides, no copy) and gives the reference's output."""
    _compare(spec, torch.bfloat16, 16, lens, (16, 8), 128, kv_stored=True, kv_dtype=kv_dtype,
             q_in_qkv=True)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("lens", [PREFILL, EXTEND, DECODE], ids=["prefill", "extend", "decode"])
def test_backend_matches_torch_fp8_kv(spec: str, page: int, lens) -> None:
    """An FP8 pool with K and V scales 0.3 and 2.5 (bf16 model): every backend reads it as the
    torch reference does (fp8 * scale), and `forward` stores k/v quantized alike."""
    _compare(spec, torch.bfloat16, page, lens, (16, 8), 128, kv_dtype=torch.float8_e4m3fn)
    _compare(spec, torch.bfloat16, page, lens, (16, 8), 128, kv_stored=True,
             kv_dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype,kv_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                            (torch.bfloat16, torch.float8_e4m3fn)],
                         ids=["fp32", "bf16", "bf16-kv-fp8"])
def test_decode_cuda_graph_replay_matches_eager(spec: str, dtype: torch.dtype, kv_dtype) -> None:
    """Capture one decode step at bs 8 for dummy requests (length 1, KV written to the scratch
    slot), then replay it for real requests: same output as an eager run (bit for bit for the
    Triton kernels, whose split count only depends on the batch size). With an FP8 pool the
    scales are captured as constants."""
    from radixserve.attention import create_attn_backend
    from radixserve.attention.torch_backend import TorchBackend

    prefix = [899, 2, 63, 0, 1199, 30, 15, 1999]
    cfg, batch, q, k, v = backend_case("cuda", dtype, 16, prefix, [1] * 8, (16, 8), 128, seed=3,
                                       kv_dtype=kv_dtype)
    backend = create_attn_backend(spec, cfg)
    backend.init_cuda_graph(16)
    static = dataclasses.replace(
        batch, out_loc=torch.full_like(batch.out_loc, cfg.kv_pool.dummy_slot),
        req_rows=batch.req_rows.clone(), seq_lens=torch.ones_like(batch.seq_lens),
        seq_lens_cpu=[1] * 8,
    )
    sq, sk, sv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    backend.prepare_for_capture(static)
    for _ in range(2):  # compile and warm outside the capture
        backend.forward(sq, sk, sv, 0, static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = backend.forward(sq, sk, sv, 0, static)

    # a replay refills the captured batch's tensors in place (`CudaGraphRunner`)
    for name in ("out_loc", "req_rows", "seq_lens"):
        getattr(static, name).copy_(getattr(batch, name))
    sq.copy_(q), sk.copy_(k), sv.copy_(v)
    backend.prepare_for_replay(dataclasses.replace(static, seq_lens_cpu=batch.seq_lens_cpu))
    graph.replay()
    torch.cuda.synchronize()
    eager = run_backend(create_attn_backend(spec, cfg), dataclasses.replace(batch), q, k, v, 1)[0]
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v, 1)[0]
    if spec == "triton":
        assert torch.equal(static_out, eager)
    else:
        torch.testing.assert_close(static_out.float(), eager.float(), rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(static_out.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])


def test_flashinfer_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from radixserve.attention.flashinfer_backend import FlashInferBackend

    cfg, *_ = backend_case("cuda", torch.bfloat16, 16, [0], [4], (16, 8), 128)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(ValueError, match="flashinfer"):
        FlashInferBackend(cfg)
