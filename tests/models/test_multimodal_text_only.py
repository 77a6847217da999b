"""Multimodal checkpoints (Gemma 3 and Mistral 3 ...ForConditionalGeneration) load as their text
model, built from `text_config`, in both checkpoint layouts (transformers 5's and the Hub's); the
vision tower and projector are never read; any other unknown tensor is still reported, and a
missing language-model tensor still fails; an FP8 checkpoint takes the same path. Parity with transformers: tests/runtime/
test_multimodal_parity.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve.layers import lazy_weight
from radixserve.models.loader import load_model
from radixserve.models.multimodal import VISION_PREFIXES
from radixserve.testing import (
    MULTIMODAL,
    MULTIMODAL_CASES,
    MULTIMODAL_LAYOUTS,
    SLIDING_WINDOW,
)
from tests.models.fp8_checkpoints import write_fp8_checkpoint
from tests.models.helpers import hf_logits, our_logits
from tests.runtime.helpers import random_prompts


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def _copy_with(src: Path, dst: Path, tensors: dict[str, torch.Tensor]) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize(("arch", "layout"), MULTIMODAL_CASES)
def test_the_text_model_is_built_from_text_config(multimodal_ckpts, arch, layout):
    path = multimodal_ckpts[arch, layout]
    text = json.loads((path / "config.json").read_text())["text_config"]
    model, cfg = load_model(path, torch.float32, "cpu")
    assert type(model).__name__ == {"gemma3_vision": "Gemma3ForCausalLM",
                                    "mistral3": "MistralForCausalLM"}[arch]
    assert (cfg.num_hidden_layers, cfg.vocab_size) == (text["num_hidden_layers"],
                                                       text["vocab_size"])
    assert len(model.model.layers) == text["num_hidden_layers"]
    assert SLIDING_WINDOW in model.sliding_windows()


@pytest.mark.parametrize("layout", MULTIMODAL_LAYOUTS)
def test_tied_lm_head_is_the_embedding(multimodal_ckpts, layout):
    model, cfg = load_model(multimodal_ckpts["gemma3_vision", layout], torch.float32, "cpu")
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize(("arch", "layout"), MULTIMODAL_CASES)
def test_only_language_model_tensors_are_read(multimodal_ckpts, arch, layout, monkeypatch, caplog):
    path = multimodal_ckpts[arch, layout]
    tensors = _tensors(path)
    vision = {k for k in tensors if k.startswith(VISION_PREFIXES)}
    assert vision and len(vision) < len(tensors)
    language = sum(t.numel() for k, t in tensors.items() if k not in vision)
    read: list[int] = []
    real_load = lazy_weight.LazyWeight.load
    monkeypatch.setattr(lazy_weight.LazyWeight, "load",
                        lambda self: read.append(self.shape.numel()) or real_load(self))
    with caplog.at_level(logging.INFO, logger="radixserve.models"):
        load_model(path, torch.float32, "cpu")
    assert sum(read) == language
    assert "vision tower not loaded (text-only)" in caplog.text
    assert "ignored" not in caplog.text


@pytest.mark.parametrize("layout", MULTIMODAL_LAYOUTS)
def test_an_unknown_tensor_is_still_reported(multimodal_ckpts, layout, tmp_path, caplog):
    src = multimodal_ckpts["mistral3", layout]
    tensors = _tensors(src)
    vision = next(k for k in tensors if k.startswith(VISION_PREFIXES))
    tensors["visual_encoder." + vision.split(".", 1)[1]] = tensors.pop(vision)
    with caplog.at_level(logging.WARNING, logger="radixserve.models"):
        load_model(_copy_with(src, tmp_path / "renamed", tensors), torch.float32, "cpu")
    assert "ignored 1 checkpoint tensors" in caplog.text and "visual_encoder." in caplog.text


@pytest.mark.parametrize("layout", MULTIMODAL_LAYOUTS)
def test_a_missing_language_model_tensor_fails(multimodal_ckpts, layout, tmp_path):
    src = multimodal_ckpts["gemma3_vision", layout]
    tensors = _tensors(src)
    gone = next(k for k in tensors if k.endswith("layers.1.mlp.down_proj.weight"))
    del tensors[gone]
    with pytest.raises(ValueError, match=r"missing 1 weight\(s\): model\.layers\.1\.mlp\.down_proj"):
        load_model(_copy_with(src, tmp_path / "missing", tensors), torch.float32, "cpu")


@pytest.mark.parametrize("fmt", ["block", "channel"])
def test_fp8_checkpoint_loads_its_language_model(multimodal_ckpts, fmt, tmp_path):
    """The FP8 path reads scales under the same names: logits equal transformers' on the
    dequantized weights (vision linears are quantized too, and never read)."""
    src = multimodal_ckpts["mistral3", "hub"]
    path = write_fp8_checkpoint(src, tmp_path / fmt, fmt, ref=tmp_path / "ref")
    assert any(k.startswith("language_model.") and "scale" in k for k in _tensors(path))
    ids = random_prompts(1, [SLIDING_WINDOW], 300, seed=4)[0]  # the dense reference: no window
    model, _ = load_model(path, torch.float32, "cpu")
    torch.testing.assert_close(our_logits(model, ids),
                               hf_logits(tmp_path / "ref", ids, model_class=MULTIMODAL["mistral3"][2]),
                               atol=1e-4, rtol=0)


def test_eos_ids_and_dtype_come_from_text_config_where_the_outer_config_has_none(multimodal_ckpts, tmp_path):
    from types import SimpleNamespace

    from radixserve.models.generation import eos_token_ids
    from radixserve.models.loader import resolve_dtype

    src = multimodal_ckpts["gemma3_vision", "hub"]
    bare = _copy_with(src, tmp_path / "bare", _tensors(src))
    (bare / "generation_config.json").unlink()
    cfg = json.loads((bare / "config.json").read_text())
    assert "eos_token_id" not in cfg and cfg["text_config"]["eos_token_id"] == 2
    assert eos_token_ids(bare) == {2}
    outer = SimpleNamespace(text_config=SimpleNamespace(dtype="bfloat16"))
    assert resolve_dtype("auto", outer, "cpu") == torch.bfloat16
    outer.dtype = "float16"  # the outer config's, where it names one
    assert resolve_dtype("auto", outer, "cpu") == torch.float16
