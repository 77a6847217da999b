"""Mistral and Gemma 3 (text): full-sequence logits equal transformers' on tiny random checkpoints
within the sliding window; a Mistral whose window covers the whole context is full attention; the
models declare their windows per layer; backends without windows refuse such a model, and a
hybrid unless both its parts implement them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.attention.base import AttnConfig, BaseAttnBackend
from radixserve.models.loader import load_model
from radixserve.testing import SLIDING_WINDOW, WINDOWED_ARCHS, write_tiny_checkpoint
from tests.models.helpers import hf_logits, our_logits
from tests.runtime.helpers import random_prompts


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("windowed")
    ckpts = {a: write_tiny_checkpoint(a, root / a) for a in WINDOWED_ARCHS}
    ckpts["mistral_full"] = write_tiny_checkpoint("mistral", root / "mf", sliding_window=None)
    return ckpts


@pytest.mark.parametrize("arch", WINDOWED_ARCHS)
def test_logits_match_transformers_within_the_window(windowed, arch):
    ids = random_prompts(1, [SLIDING_WINDOW], 300, seed=1)[0]
    model, _ = load_model(windowed[arch], torch.float32, "cpu")
    torch.testing.assert_close(our_logits(model, ids), hf_logits(windowed[arch], ids),
                               atol=1e-4, rtol=0)


def test_mistral_without_a_window_matches_transformers_on_a_long_prompt(windowed):
    ids = random_prompts(1, [150], 300, seed=2)[0]
    model, _ = load_model(windowed["mistral_full"], torch.float32, "cpu")
    assert model.sliding_windows() == ()
    torch.testing.assert_close(our_logits(model, ids), hf_logits(windowed["mistral_full"], ids),
                               atol=1e-4, rtol=0)


def test_models_declare_their_windows_per_layer(windowed):
    gemma, _ = load_model(windowed["gemma3"], torch.float32, "cpu")
    mistral, _ = load_model(windowed["mistral"], torch.float32, "cpu")
    w = SLIDING_WINDOW
    assert gemma.sliding_windows() == (w, None, w)  # layer_types: sliding, full, sliding
    assert mistral.sliding_windows() == (w, w)


def test_gemma3_pieces_differ_from_llama_where_they_should(windowed):
    """The checkpoint really exercises Gemma's parts: its (1 + weight) norms store 1 + w, the
    query norm carries head_dim / query_pre_attn_scalar, local and global layers rotate with
    different frequencies, and the final logits are soft-capped."""
    from safetensors.torch import load_file

    model, cfg = load_model(windowed["gemma3"], torch.float32, "cpu")
    w = load_file(str(windowed["gemma3"] / "model.safetensors"))
    layer = model.model.layers[0]
    assert torch.equal(layer.pre_feedforward_layernorm.weight,
                       1 + w["model.layers.0.pre_feedforward_layernorm.weight"])
    gain = (16 / 24) ** 0.5
    torch.testing.assert_close(layer.self_attn.q_norm.weight,
                               (1 + w["model.layers.0.self_attn.q_norm.weight"]) * gain)
    local = model.model.layers[0].self_attn.rotary_emb.cos_sin_cache
    glob = model.model.layers[1].self_attn.rotary_emb.cos_sin_cache
    assert not torch.allclose(local[5], glob[5])
    assert model.compute_logits(torch.randn(3, cfg.hidden_size) * 100).abs().max() <= 30.0


class _NoWindows(BaseAttnBackend):
    def prepare(self, batch):  # pragma: no cover - never built
        raise AssertionError

    def attend(self, q, layer_id, batch, out=None):  # pragma: no cover
        raise AssertionError


def _cfg(windows: tuple[int | None, ...]) -> AttnConfig:
    from types import SimpleNamespace

    pool = SimpleNamespace(dtype=torch.float32)
    return AttnConfig(4, 2, 16, 1, pool, torch.zeros(1, 1), torch.device("cpu"),  # type: ignore[arg-type]
                      torch.float32, windows)


class _Windows(_NoWindows):
    supports_sliding_window = True


def test_a_backend_without_windows_refuses_a_windowed_model():
    with pytest.raises(ValueError,
                       match=r"does not implement sliding-window attention.*\[24\].*--attn triton"):
        _NoWindows(_cfg((24, None, 24)))
    _NoWindows(_cfg(()))  # a model without windows is fine
    _NoWindows(_cfg((None, None)))


def test_a_hybrid_takes_windows_only_where_both_parts_do():
    from radixserve.attention.hybrid import HybridBackend

    cfg = _cfg((24, None))
    assert HybridBackend(_Windows(cfg), _Windows(cfg)).supports_sliding_window
    lacking = _Windows(cfg)
    lacking.supports_sliding_window = False  # (a part that would have refused on its own)
    for parts in ((_Windows(cfg), lacking), (lacking, _Windows(cfg))):
        with pytest.raises(ValueError, match="does not implement sliding-window attention"):
            HybridBackend(*parts)
    plain = _cfg(())  # a model without windows: any parts
    assert not HybridBackend(_NoWindows(plain), _Windows(plain)).supports_sliding_window


def test_torch_and_triton_implement_windows_flashinfer_does_not():
    from radixserve.attention.flashinfer_backend import FlashInferBackend
    from radixserve.attention.torch_backend import TorchBackend
    from radixserve.attention.triton_backend import TritonBackend

    assert TorchBackend.supports_sliding_window and TritonBackend.supports_sliding_window
    assert not FlashInferBackend.supports_sliding_window


@pytest.mark.parametrize("arch", WINDOWED_ARCHS)
def test_tiny_checkpoints_decode_varied_tokens_past_the_window(windowed, arch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(windowed[arch], dtype=torch.float32)
    ids = torch.tensor([random_prompts(1, [20], 300, seed=4)[0]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                         do_sample=False, eos_token_id=None, pad_token_id=0)[0, 20:].tolist()
    assert len(set(out)) >= 8, out
