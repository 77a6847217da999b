"""Sampling: seeds reproduce, filters that leave one token equal greedy, penalties match the
definitions (HF's repetition penalty is checked against transformers itself)."""
from __future__ import annotations

import pytest
import torch

from radixserve import LLM, SamplingParams
from radixserve.engine.sampler import filter_logits
from tests.runtime.helpers import random_prompts


@pytest.fixture(scope="module")
def llm(tiny_ckpts):
    return LLM(str(tiny_ckpts["qwen2"]), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, [5, 30, 12, 64], 300, seed=7)


def tokens(llm, prompts, **kw) -> list[list[int]]:
    return [r.token_ids for r in llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True, **kw))]


def test_same_seed_same_tokens_regardless_of_batch(llm, prompts) -> None:
    a = tokens(llm, prompts, temperature=1.0, seed=123)
    b = tokens(llm, prompts[::-1], temperature=1.0, seed=123)[::-1]
    c = tokens(llm, prompts, temperature=1.0, seed=124)
    assert a == b
    assert a != c
    assert a != tokens(llm, prompts)  # temperature 1 is not greedy


@pytest.mark.parametrize("kw", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_filters_leaving_one_token_equal_greedy(llm, prompts, kw) -> None:
    assert tokens(llm, prompts, temperature=1.5, seed=5, **kw) == tokens(llm, prompts)


def test_repetition_penalty_matches_transformers(llm, prompts, tiny_ckpts) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_ckpts["qwen2"], dtype=torch.float32).eval()
    ours = tokens(llm, prompts, repetition_penalty=1.7)
    for p, got in zip(prompts, ours):
        ids = torch.tensor([p])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, min_new_tokens=10,
                          do_sample=False, repetition_penalty=1.7, pad_token_id=0)
        assert got == ref[0, len(p):].tolist()


def test_frequency_and_presence_penalties_follow_openai_definition() -> None:
    from radixserve.engine.sampler import apply_penalties
    from radixserve.scheduler.req import Req

    req = Req(0, [1], SamplingParams(frequency_penalty=0.5, presence_penalty=0.25))
    req.output_ids = [2, 2, 3]
    out = apply_penalties(torch.zeros(5), req)
    assert out.tolist() == [0.0, 0.0, -1.25, -0.75, 0.0]


def test_filter_logits_masks_outside_nucleus_and_topk() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isinf(filter_logits(logits, 2, 1.0, 0.0)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_logits(logits, -1, 0.7, 0.0)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_logits(logits, -1, 1.0, 0.5)).tolist() == [False, False, True, True]


def test_logprobs_are_log_softmax_of_logits(llm) -> None:
    s = llm.scheduler
    s.add_request(900, [5, 6, 7, 8], SamplingParams(max_tokens=1, logprobs=3))
    outs = []
    while s.has_work:
        outs += s.step()
    (o,) = outs
    assert o.top_logprobs[0][0] == o.token_id  # greedy picks the most likely token
    assert o.logprob == pytest.approx(o.top_logprobs[0][1])
    assert [lp for _, lp in o.top_logprobs] == sorted((lp for _, lp in o.top_logprobs), reverse=True)
    assert sum(torch.tensor([lp for _, lp in o.top_logprobs]).exp()) <= 1.0 + 1e-5
