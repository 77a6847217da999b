"""On CUDA: `--attn auto` picks the fastest installed backend, a bad name is a clear ValueError,
and the model's layers take their Triton kernels."""
from __future__ import annotations

import pytest
import torch

from tests.gpu.helpers import HAS_FLASHINFER, HAS_TRITON

pytestmark = pytest.mark.gpu


def _engine(path, attn: str):
    from radixserve.config import EngineConfig
    from radixserve.engine.engine import Engine

    cfg = EngineConfig(model=str(path), device="cuda", dtype="bfloat16", attn=attn)
    return Engine(cfg, max_running_requests=4)


def test_auto_picks_installed_backends(tiny_ckpts_hd64) -> None:
    from radixserve.attention.hybrid import HybridBackend

    installed = {"TorchBackend"} | {cls for cls, ok in (
        ("TritonBackend", HAS_TRITON), ("FlashInferBackend", HAS_FLASHINFER)) if ok}
    fastest = (
        "FlashInferBackend" if HAS_FLASHINFER else "TritonBackend" if HAS_TRITON else "TorchBackend"
    )
    engine = _engine(tiny_ckpts_hd64["llama"], "auto")
    backend = engine.attn_backend
    prefill, decode = (
        (backend.prefill, backend.decode) if isinstance(backend, HybridBackend) else (backend,) * 2
    )
    assert {type(prefill).__name__, type(decode).__name__} <= installed
    assert type(prefill).__name__ == fastest
    if HAS_TRITON:  # a decode backend that CUDA graphs can capture
        assert engine.graph_runner is not None


@pytest.mark.parametrize("spec,bad", [("nope", "nope"), ("triton,nope", "nope")])
def test_bad_attn_name_is_a_clear_error(tiny_ckpts, spec: str, bad: str) -> None:
    with pytest.raises(ValueError, match=rf"unknown attention backend '{bad}'; choose one of: auto"):
        _engine(tiny_ckpts["llama"], spec)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_layers_take_the_triton_kernels_on_cuda() -> None:
    from radixserve.layers.moe import SparseMoeBlock
    from radixserve.utils import kernel_path

    x = torch.zeros(2, 8, device="cuda")
    assert kernel_path.use_triton(x) and not kernel_path.use_triton(x.cpu())
    assert SparseMoeBlock._backend(x) == "triton" and SparseMoeBlock._backend(x.cpu()) == "torch"
