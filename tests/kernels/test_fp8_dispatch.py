"""FP8 linear layers' switch to the FP8-weight kernel, run on CPU through Triton's interpreter:
with the layers' kernel path forced on (as on CUDA), a block-FP8 model's prefill (17 rows: the
tiled kernel) and a per-channel one's short prompt (16 rows: the skinny kernel) give
transformers' logits on the dequantized checkpoint, which weight-only dequantization computes
exactly up to float32 summation order."""
from __future__ import annotations

import collections
import types
from pathlib import Path

import pytest
import torch
from tests.kernels.kernel_cases import interpreter_only

pytestmark = interpreter_only
PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 130, 64, 11, 200, 19, 88, 301, 6, 45]


@pytest.fixture(scope="module")
def fp8_ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    from tests.models.fp8_checkpoints import write_fp8_checkpoint

    from radixserve.testing import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("fp8_dispatch")
    src = write_tiny_checkpoint("qwen3", root / "src")
    return {f: (write_fp8_checkpoint(src, root / f, f, ref=root / f"{f}-ref"), root / f"{f}-ref")
            for f in ("block", "channel")}


@pytest.mark.parametrize("fmt,rows", [("block", 17), ("channel", 16)])
def test_fp8_layers_through_the_kernel_give_the_dequantized_logits(fp8_ckpts, monkeypatch, fmt,
                                                                   rows) -> None:
    from tests.models.helpers import hf_logits, our_logits

    from radixserve.layers import fp8_linear
    from radixserve.models import loader

    path, ref = fp8_ckpts[fmt]
    monkeypatch.setattr(loader, "use_fp8_gemm", lambda device, dtype: True)
    model, _ = loader.load_model(path, torch.float32, "cpu")
    calls: collections.Counter = collections.Counter()
    kernel = fp8_linear.fp8_gemm

    def counted(*args, **kwargs):
        calls["fp8_gemm"] += 1
        return kernel(*args, **kwargs)

    monkeypatch.setattr(fp8_linear, "fp8_gemm", counted)
    monkeypatch.setattr(fp8_linear, "kernel_path", types.SimpleNamespace(use_triton=lambda t: True))
    got = our_logits(model, PROMPT[:rows])
    # every layer's four projections (QKV, O, gate-up, down) through the kernel
    assert calls["fp8_gemm"] == 4 * model.hf_config.num_hidden_layers
    torch.testing.assert_close(got, hf_logits(ref, PROMPT[:rows]), atol=1e-4, rtol=0)
