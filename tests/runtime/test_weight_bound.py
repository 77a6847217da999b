"""The weight-read bound that `bench latency` reports at batch 1: the bytes a step reads, counted
from transformers' own parameter count of the same checkpoint, and the reported line's figures
agreeing with each other."""
from __future__ import annotations

import re

import pytest
import torch

from radixserve.cli import main


def _ours(path, dtype: torch.dtype = torch.float32):
    from radixserve.models.loader import load_model

    return load_model(path, dtype, "cpu")[0]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_dense_step_reads_every_weight_but_the_input_embedding(tiny_ckpts, arch, dtype) -> None:
    from radixserve.bench.weight_bound import weight_bytes_per_step

    hf = _hf(tiny_ckpts[arch])
    embedding = hf.get_input_embeddings().weight
    tied = hf.get_output_embeddings().weight is embedding
    # a tied table is the LM head's weight, read whole; an untied one is only looked up
    want = hf.num_parameters() - (0 if tied else embedding.numel())
    assert weight_bytes_per_step(_ours(tiny_ckpts[arch], dtype)) == want * dtype.itemsize


def test_a_moe_step_reads_its_top_k_experts(tiny_ckpts) -> None:
    from radixserve.bench.weight_bound import weight_bytes_per_step

    hf = _hf(tiny_ckpts["qwen3_moe"])
    cfg = hf.config
    experts = sum(p.numel() for n, p in hf.named_parameters() if ".experts." in n)
    assert experts > 0
    embedding = hf.get_input_embeddings().weight
    tied = hf.get_output_embeddings().weight is embedding
    want = (hf.num_parameters() - (0 if tied else embedding.numel())
            - experts + experts * cfg.num_experts_per_tok / cfg.num_experts)
    assert weight_bytes_per_step(_ours(tiny_ckpts["qwen3_moe"])) == round(want * 4)


def test_fp8_weights_count_a_byte_and_their_scales(tiny_ckpts) -> None:
    from radixserve.bench.weight_bound import weight_bytes_per_step
    from radixserve.layers.fp8_linear import to_fp8_linear

    model = _ours(tiny_ckpts["qwen3"])
    before = weight_bytes_per_step(model)
    layer = model.model.layers[0].mlp.down_proj
    n, k = layer.weight.shape
    to_fp8_linear(layer, 128)
    assert weight_bytes_per_step(model) == before - n * k * 4 + n * k + n * -(-k // 128) * 4


def test_latency_reports_batch_one_against_the_bound(tiny_ckpts, capsys) -> None:
    from radixserve.bench.weight_bound import weight_bytes_per_step

    argv = ["bench", "latency", "--model", str(tiny_ckpts["qwen3"]), "--device", "cpu",
            "--batch-sizes", "1", "2", "--steps", "2", "--input-len", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    num = r"([\d.]+(?:e-?\d+)?)"
    m = re.search(rf"^batch\s+1:\s+{num} ms/step.*?\s(\d+)% of the weight-read bound \({num} "
                  rf"GB a step at {num} TB/s copy: {num} ms\)$", out, re.MULTILINE)
    assert m, out
    ms, share, gb, tbs, bound = (float(g) for g in m.groups())
    want_gb = weight_bytes_per_step(_ours(tiny_ckpts["qwen3"])) / 1e9
    assert gb == pytest.approx(want_gb, rel=1e-3)  # four significant digits
    assert tbs > 0 and bound == pytest.approx(gb / tbs, rel=2e-3)
    assert share == pytest.approx(100 * bound / ms, abs=1)
    assert "bound" not in re.search(r"^batch\s+2:.*$", out, re.MULTILINE).group(0)
