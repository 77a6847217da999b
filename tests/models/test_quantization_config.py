"""A checkpoint quantized in a way we do not load fails before any weight is read, with one message
naming its method and listing the supported ones; the supported FP8 variants are recognised."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from radixserve.models import loader
from radixserve.models.quantization import read_quantization
from radixserve.testing import write_tiny_checkpoint
from tests.models.fp8_checkpoints import quantization_config

_INT4_CT = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}
UNSUPPORTED = [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "'awq'"),
    ({"quant_method": "gptq", "bits": 4}, "'gptq'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "fmt='e5m2'"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "without weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128], "fmt": "e4m3"}, "weight_block_size=[128]"),
    (_INT4_CT, "4-bit int"),
    ({"bits": 4}, "with no quant_method"),
]


@pytest.mark.parametrize("qc,named", UNSUPPORTED)
def test_unsupported_quantization_fails_before_any_weight(tmp_path, monkeypatch, qc, named):
    path = write_tiny_checkpoint("llama", tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))

    def no_work(*args, **kwargs):
        raise AssertionError("the model was built or a weight read before the check")

    monkeypatch.setattr(loader, "build_model", no_work)
    monkeypatch.setattr(loader, "iter_safetensors", no_work)
    with pytest.raises(ValueError) as e:
        loader.load_model(path, loader.torch.float32, "cpu")
    msg = str(e.value)
    assert named in msg and "not supported" in msg
    assert "supported quantization_config methods: fp8" in msg and "compressed-tensors" in msg


@pytest.mark.parametrize("fmt,granularity,block", [("block", "block", (32, 16)),
                                                   ("channel", "channel", None),
                                                   ("tensor", "tensor", None)])
def test_supported_fp8_variants_are_read(fmt, granularity, block):
    scheme = read_quantization(SimpleNamespace(quantization_config=quantization_config(fmt)))
    assert scheme is not None and (scheme.granularity, scheme.block) == (granularity, block)
    assert read_quantization(SimpleNamespace()) is None


def test_command_line_preflight_names_the_method():
    from radixserve.cli.preflight import UsageError, check_architecture

    shape = SimpleNamespace(architectures=["LlamaForCausalLM"],
                            quantization_config={"quant_method": "awq", "bits": 4})
    with pytest.raises(UsageError, match="quantization method 'awq' is not supported"):
        check_architecture(shape)
