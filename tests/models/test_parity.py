"""Every architecture's full-sequence logits equal transformers' on the same float32 weights."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from radixserve.models.loader import load_model
from radixserve.testing import ARCHS
from tests.models.helpers import hf_logits, our_logits

PROMPT = "Rotary position embeddings rotate query and key vectors. The quick brown fox, 2+2=4! " * 3


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(tiny, arch):
    ids = AutoTokenizer.from_pretrained(tiny[arch]).encode(PROMPT)
    assert len(ids) > 60
    model, _ = load_model(tiny[arch], torch.float32, "cpu")
    ours, ref = our_logits(model, ids), hf_logits(tiny[arch], ids)
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_prefix_logits_do_not_see_later_tokens(tiny):
    model, _ = load_model(tiny["qwen3"], torch.float32, "cpu")
    ids = list(range(5, 45))
    torch.testing.assert_close(
        our_logits(model, ids[:20]), our_logits(model, ids)[:20], atol=1e-5, rtol=0
    )


def test_bfloat16_model_runs_in_bfloat16_and_stays_close(tiny):
    ids = list(range(5, 40))
    model, _ = load_model(tiny["llama3"], torch.bfloat16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.layers[0].self_attn.rotary_emb.cos_sin_cache.dtype == torch.float32
    logits = our_logits(model, ids)
    assert logits.dtype == torch.float32
    ref = hf_logits(tiny["llama3"], ids)
    assert (logits - ref).abs().mean() < 0.1
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8
