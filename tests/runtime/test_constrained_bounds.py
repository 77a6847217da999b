"""Constrained requests that must fail alone, in the scheduler on CPU: a dead end met while
generating, or a row of logits with nothing to sample from, fails that request alone while its
neighbours' tokens stay those of a run without it."""
from __future__ import annotations

import time

import pytest
import torch

from radixserve import SamplingParams
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.core.request import Req
from radixserve.engine.sampler import Sampler
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import random_prompts

# a choice first, then nothing: only generating finds the dead end
DEAD_AFTER_A_CHOICE = 'root ::= ("a" | "b") dead\ndead ::= [^\\0-\\U0010ffff]'


def make(path, overlap: bool = True) -> Scheduler:
    eng = EngineConfig(model=str(path), dtype="float32", device="cpu")
    return Scheduler(eng, SchedulerConfig(max_running_requests=8, overlap=overlap))


def run(s: Scheduler, limit_s: float = 120.0) -> tuple[dict[int, list], list]:
    """Step until idle (failing past `limit_s`): each request's outputs, and the failures."""
    outs: dict[int, list] = {}
    failures: list = []
    deadline = time.monotonic() + limit_s
    while s.has_work:
        assert time.monotonic() < deadline, f"still working after {limit_s}s: {s.stats()}"
        for o in s.step():
            outs.setdefault(o.uid, []).append(o)
        failures += s.take_failures()
    return outs, failures


@pytest.fixture(scope="module")
def path(tiny_ckpts):
    return tiny_ckpts["llama"]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_dead_end_met_while_generating_fails_that_request_alone(path, overlap, temperature) -> None:
    prompts = random_prompts(2, [6, 9], 300, seed=3)
    plain = SamplingParams(max_tokens=8, ignore_eos=True, temperature=temperature, seed=1)
    alone = make(path, overlap)
    alone.add_request(0, prompts[0], plain)
    ref, _ = run(alone)
    s = make(path, overlap)
    s.add_request(0, prompts[0], plain)
    s.add_request(1, prompts[1], SamplingParams(max_tokens=8, temperature=temperature, seed=2,
                                                ebnf=DEAD_AFTER_A_CHOICE))
    outs, failures = run(s)
    ((uid, message, param, status),) = failures
    assert (uid, param, status) == (1, "ebnf", 400)
    assert message == "ebnf: the grammar allows no token after the 1 generated: no output can complete it"
    from transformers import AutoTokenizer

    (first,) = outs[1]  # the choice, then the failure instead of a token
    assert not first.finished and AutoTokenizer.from_pretrained(path).decode([first.token_id]) in ("a", "b")
    assert [o.token_id for o in outs[0]] == [o.token_id for o in ref[0]]
    s.check_integrity()
    assert not s.has_work and s.stats()["running"] == 0


def test_rows_with_nothing_to_sample_from_are_flagged_not_fatal() -> None:
    """NaN, +inf, or -inf throughout: multinomial would fail (a device assert on CUDA); such a
    row is flagged and sampled as uniform, the others as ever."""
    reqs = [Req(i, [1], SamplingParams(temperature=1.0, seed=i)) for i in range(4)]
    sampler = Sampler(torch.device("cpu"))
    for r in reqs:
        r.generator = sampler.new_request_generator(r.params.seed)
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    logits[1] = float("-inf")
    logits[2, 7] = float("nan")
    logits[3, 9] = float("inf")
    good = logits[0].clone()
    res = sampler.sample(logits, reqs)
    assert res.invalid is not None and res.invalid.tolist() == [False, True, True, True]
    want = torch.multinomial(torch.softmax(good, -1), 1, generator=sampler.new_request_generator(0))
    assert res.tokens[0] == want[0]


def test_logits_with_no_valid_value_fail_that_request_alone(path, monkeypatch) -> None:
    prompts = random_prompts(2, [5, 8], 300, seed=4)
    sampled = SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0, seed=7)
    alone = make(path)
    alone.add_request(1, prompts[1], sampled)
    ref, _ = run(alone)
    s = make(path)
    sample = s.sampler.sample

    def poisoned(logits, reqs, store=None):  # a model that answers NaN for request 0
        for i, r in enumerate(reqs):
            if r.uid == 0:
                logits[i] = float("nan")
        return sample(logits, reqs, store)

    monkeypatch.setattr(s.sampler, "sample", poisoned)
    s.add_request(0, prompts[0], SamplingParams(max_tokens=6, temperature=0.8, seed=2))
    s.add_request(1, prompts[1], sampled)
    outs, failures = run(s)
    assert [(f.uid, f.param, f.status) for f in failures] == [(0, None, 500)]
    assert "NaN" in failures[0].message and 0 not in outs
    assert [o.token_id for o in outs[1]] == [o.token_id for o in ref[1]]
    s.check_integrity()
