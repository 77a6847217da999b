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
    from radixserve.core.request import Req
    from radixserve.engine.sampler import apply_penalties

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


def test_model_dtype_logits_are_sampled_in_float32() -> None:
    """The engine hands over bfloat16 logits; greedy rows pick the float32 argmax and logprobs
    are computed after widening (bfloat16 log-softmax would be off by ~1e-2)."""
    from radixserve.core.request import Req
    from radixserve.engine.sampler import Sampler

    logits = (torch.randn(2, 500, generator=torch.Generator().manual_seed(0)) * 4).bfloat16()
    reqs = [Req(0, [1], SamplingParams()), Req(1, [1], SamplingParams(logprobs=3))]
    greedy = Sampler(torch.device("cpu")).sample(logits[:1].clone(), reqs[:1])
    res = Sampler(torch.device("cpu")).sample(logits.clone(), reqs)
    want_tokens = logits.float().argmax(-1)
    assert greedy.tokens.tolist() == want_tokens[:1].tolist()
    assert res.tokens.tolist() == want_tokens.tolist()
    want_lp = torch.log_softmax(logits.float(), -1)
    assert res.chosen_logprob is not None and res.top_logprobs is not None
    assert res.chosen_logprob.dtype == torch.float32
    torch.testing.assert_close(res.chosen_logprob, want_lp.gather(1, want_tokens[:, None])[:, 0])
    torch.testing.assert_close(res.top_logprobs, want_lp.topk(3, -1).values)


def test_sampled_tokens_reach_the_token_store() -> None:
    """Both the greedy fast path and the float32 path (a sampled request beside a greedy one)
    write each request's token where the next step reads it, and nothing else."""
    from radixserve.core.request import Req
    from radixserve.engine.sampler import Sampler
    from radixserve_kernels import TokenStore

    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    logits[1, 7] = 1e4  # the sampled request's only likely token
    for params in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
        reqs = [Req(0, [1], SamplingParams()), Req(1, [1], params)]
        pool = torch.full((4, 6), -1, dtype=torch.int64)
        store = TokenStore(pool, torch.tensor([3, 1]), torch.tensor([2, 9], dtype=torch.int32), 5)
        res = Sampler(torch.device("cpu")).sample(logits.clone(), reqs, store)
        assert res.tokens.tolist() == [int(logits[0].argmax()), 7]
        want = torch.full((4, 6), -1, dtype=torch.int64)
        want[3, 2], want[1, 5] = res.tokens[0], 7  # the second past the cap: its last column
        assert torch.equal(pool, want)
