"""Multimodal checkpoints served text-only (Gemma 3 and Mistral 3 ...ForConditionalGeneration,
both checkpoint layouts) through the engine: greedy tokens equal transformers' `generate` of the
same multimodal checkpoint on text-only prompts past the sliding window, and full-sequence logits
match within 1e-4; TP=2 gives the same tokens."""

from __future__ import annotations

import pytest
import torch

from radixserve import LLM, SamplingParams
from radixserve.testing import (
    MULTIMODAL,
    MULTIMODAL_CASES,
    SLIDING_WINDOW,
)
from tests.models.helpers import hf_logits
from tests.runtime.helpers import hf_greedy, prefill_logits, random_prompts

LENGTHS = [7, SLIDING_WINDOW + 1, 70]
MAX_NEW = 10
SP = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
KW = {"dtype": "float32", "device": "cpu", "max_running_requests": 4, "attn": "torch"}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(len(LENGTHS), LENGTHS, 300, seed=11)


@pytest.mark.parametrize(("arch", "layout"), MULTIMODAL_CASES)
def test_greedy_tokens_and_logits_match_transformers(multimodal_ckpts, prompts, arch, layout):
    path, hf_class = multimodal_ckpts[arch, layout], MULTIMODAL[arch][2]
    llm = LLM(str(path), page_size=4, **KW)
    assert llm.scheduler.engine.attn_cfg.has_windows
    ours = [r.token_ids for r in llm.generate(prompts, SP)]
    assert ours == hf_greedy(path, prompts, MAX_NEW, model_class=hf_class)
    llm.scheduler.check_integrity()
    longest = prompts[-1]
    assert len(longest) > 2 * SLIDING_WINDOW
    logits = prefill_logits(llm.scheduler.engine, [longest])[0]
    torch.testing.assert_close(logits, hf_logits(path, longest, model_class=hf_class),
                               atol=1e-4, rtol=0)


# TP=2 over gloo, a second process for seconds: test_tp.py's TP=2 cases stay in the fast loop
@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_tp2_gives_transformers_tokens(multimodal_ckpts, prompts):
    path = multimodal_ckpts["gemma3_vision", "hub"]
    llm = LLM(str(path), tp=2, page_size=4, max_prefill_length=32, **KW)
    try:
        assert [r.token_ids for r in llm.generate(prompts, SP)] == hf_greedy(
            path, prompts, MAX_NEW, model_class=MULTIMODAL["gemma3_vision"][2])
    finally:
        llm.close()
