"""Weight loading: tied and untied heads, sharded checkpoints, missing weights, unknown
architectures, dtype resolution, EOS ids, dummy weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from radixserve.models.architectures import get_model_class
from radixserve.models.generation import eos_token_ids
from radixserve.models.loader import load_model, resolve_dtype
from tests.models.helpers import hf_logits, our_logits

IDS = list(range(7, 57))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _drop_tensor(ckpt: Path, name: str) -> None:
    tensors = load_file(ckpt / "model.safetensors")
    del tensors[name]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def test_tied_head_shares_the_embedding(tiny):
    with safe_open(tiny["llama"] / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()  # noqa: SIM118 -- safe_open is not a dict
        embed = f.get_tensor("model.embed_tokens.weight")
    model, cfg = load_model(tiny["llama"], torch.float32, "cpu")
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(model.lm_head.weight, embed, atol=0, rtol=0)


def test_untied_head_has_its_own_weight(tiny):
    with safe_open(tiny["llama3"] / "model.safetensors", "pt") as f:
        head = f.get_tensor("lm_head.weight")
    model, cfg = load_model(tiny["llama3"], torch.float32, "cpu")
    assert not cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(model.lm_head.weight, head, atol=0, rtol=0)


def test_sharded_checkpoint_loads(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny["qwen3_moe"], dtype=torch.float32)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert (tmp_path / "model.safetensors.index.json").exists() and len(shards) > 2
    model, _ = load_model(tmp_path, torch.float32, "cpu")
    torch.testing.assert_close(
        our_logits(model, IDS), hf_logits(tiny["qwen3_moe"], IDS), atol=1e-4, rtol=0
    )


@pytest.mark.parametrize(
    "arch,name",
    [
        ("qwen2", "model.layers.1.self_attn.k_proj.bias"),
        ("qwen3", "model.layers.0.self_attn.q_norm.weight"),
        ("qwen3_moe", "model.layers.2.mlp.experts.5.up_proj.weight"),
        ("llama3", "lm_head.weight"),
    ],
)
def test_missing_weight_is_named(tiny, tmp_path, arch, name):
    ckpt = _copy(tiny[arch], tmp_path / arch)
    _drop_tensor(ckpt, name)
    with pytest.raises(ValueError, match="missing 1 weight") as err:
        load_model(ckpt, torch.float32, "cpu")
    assert name in str(err.value)


def test_no_safetensors_is_an_error(tiny, tmp_path):
    ckpt = _copy(tiny["llama"], tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(ckpt, torch.float32, "cpu")


def test_dummy_load_format_reads_no_weights(tiny, tmp_path):
    ckpt = _copy(tiny["qwen3_moe"], tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    model, _ = load_model(ckpt, torch.float32, "cpu", load_format="dummy")
    logits = our_logits(model, IDS)
    assert logits.shape == (len(IDS), 384) and torch.isfinite(logits).all()


def test_unknown_architecture_lists_supported(tiny, tmp_path):
    ckpt = _copy(tiny["llama"], tmp_path / "ckpt")
    cfg_file = ckpt / "config.json"
    cfg_file.write_text(
        json.dumps({**json.loads(cfg_file.read_text()), "architectures": ["FooForCausalLM"]})
    )
    with pytest.raises(ValueError) as err:
        load_model(ckpt, torch.float32, "cpu")
    msg = str(err.value)
    assert "FooForCausalLM" in msg
    for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        assert name in msg


@pytest.mark.parametrize(
    "arch,cls",
    [
        ("llama", "LlamaForCausalLM"),
        ("qwen2", "Qwen2ForCausalLM"),
        ("qwen3", "Qwen3ForCausalLM"),
        ("qwen3_moe", "Qwen3MoeForCausalLM"),
    ],
)
def test_architecture_lookup(tiny, arch, cls):
    from transformers import AutoConfig

    assert get_model_class(AutoConfig.from_pretrained(tiny[arch])).__name__ == cls


@pytest.mark.parametrize(
    "spec,declared,device,expected",
    [
        ("auto", "bfloat16", "cpu", torch.bfloat16),
        ("auto", torch.float16, "cuda", torch.float16),
        ("auto", "float32", "cpu", torch.float32),
        ("auto", "float32", "cuda", torch.bfloat16),
        ("auto", None, "cpu", torch.float32),
        ("auto", None, "cuda:0", torch.bfloat16),
        ("float16", "bfloat16", "cpu", torch.float16),
        ("float32", "bfloat16", "cuda", torch.float32),
    ],
)
def test_resolve_dtype(spec, declared, device, expected):
    assert resolve_dtype(spec, SimpleNamespace(dtype=declared), device) == expected


def test_resolve_dtype_reads_legacy_torch_dtype_and_rejects_unknown():
    assert resolve_dtype("auto", SimpleNamespace(torch_dtype="float16"), "cpu") == torch.float16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", SimpleNamespace(), "cpu")


def test_eos_ids_join_config_and_generation_config(tiny, tmp_path):
    assert eos_token_ids(tiny["qwen3"]) == {2, 4}
    ckpt = _copy(tiny["qwen3"], tmp_path / "ckpt")
    (ckpt / "generation_config.json").unlink()
    assert eos_token_ids(ckpt) == {2}
