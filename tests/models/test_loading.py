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


def _set_config(ckpt: Path, **fields) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, **fields}))


def test_a_head_of_its_own_is_used_where_the_config_says_tie(tiny, tmp_path):
    """transformers 5 ties the LM head only where the checkpoint has none of its own."""
    ckpt = _copy(tiny["llama3"], tmp_path / "own-head")  # untied: it carries lm_head.weight
    _set_config(ckpt, tie_word_embeddings=True)
    model, cfg = load_model(ckpt, torch.float32, "cpu")
    assert not cfg.tie_word_embeddings
    with safe_open(ckpt / "model.safetensors", "pt") as f:
        head, embed = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert not torch.equal(head, embed)  # tying would change the logits
    torch.testing.assert_close(model.lm_head.weight, head, atol=0, rtol=0)
    torch.testing.assert_close(our_logits(model, IDS), hf_logits(ckpt, IDS), atol=1e-4, rtol=1e-4)


def test_a_multimodal_outer_tie_covers_a_checkpoint_without_a_head(tmp_path):
    """Mistral 3 saved with transformers 5's outer `tie_word_embeddings` (True) and no lm_head:
    the head is the embedding, though `text_config` says untied."""
    from radixserve.testing import write_tiny_multimodal_checkpoint

    ckpt = write_tiny_multimodal_checkpoint("mistral3", tmp_path / "mm")
    _drop_tensor(ckpt, "lm_head.weight")
    _set_config(ckpt, tie_word_embeddings=True)
    assert not json.loads((ckpt / "config.json").read_text())["text_config"]["tie_word_embeddings"]
    model, cfg = load_model(ckpt, torch.float32, "cpu")
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = IDS[:20]  # within the sliding window: the dense test backend has none
    torch.testing.assert_close(our_logits(model, ids), hf_logits(ckpt, ids, "AutoModelForImageTextToText"),
                               atol=1e-4, rtol=1e-4)
