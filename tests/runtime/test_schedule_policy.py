"""`--schedule-policy`: with prompts of a few shared prefixes queued in interleaved order and a KV
pool that holds one prefix at a time, lpm and dfs-weight group them and compute fewer prefill
tokens than fcfs, with the same tokens; a request that shares nothing still gets in after at most
`MAX_BYPASS` later arrivals; priorities still come first."""
from __future__ import annotations

import pytest

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.policy import MAX_BYPASS
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import drain, random_prompts


def make(path, policy: str, kv_tokens: int, **sched) -> Scheduler:
    eng = EngineConfig(model=str(path), dtype="float32", device="cpu", page_size=4,
                       max_kv_tokens=kv_tokens)
    return Scheduler(eng, SchedulerConfig(schedule_policy=policy, **{"max_running_requests": 2,
                                                                     **sched}))


def admitted_order(s: Scheduler) -> list[int]:
    """Drain `s`, returning the uids in the order their first token came."""
    order: list[int] = []
    while s.has_work:
        for o in s.step():
            if o.uid not in order:
                order.append(o.uid)
    s.check_integrity()
    return order


@pytest.fixture(scope="module")
def path(tiny_ckpts):
    return tiny_ckpts["qwen3"]


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_cache_aware_policy_computes_fewer_prefill_tokens(path, policy) -> None:
    systems = random_prompts(3, [96], 300, seed=31)
    tails = random_prompts(18, [4, 9, 6], 300, seed=32)
    prompts = [systems[i % 3] + t for i, t in enumerate(tails)]  # A B C A B C ...
    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    runs = {}
    for name in ("fcfs", policy):
        s = make(path, name, 192)  # one system prompt and a request or two
        for uid, p in enumerate(prompts):
            s.add_request(uid, p, sp)
        out = drain(s)
        runs[name] = ({u: [o.token_id for o in v] for u, v in out.items()},
                      s.stats()["prefill_tokens"])
    assert runs[policy][0] == runs["fcfs"][0]
    assert runs[policy][1] < runs["fcfs"][1]


def test_lpm_lets_a_request_wait_at_most_the_bypass_bound(path) -> None:
    shared = random_prompts(1, [64], 300, seed=33)[0]
    others = random_prompts(MAX_BYPASS + 12, [5, 7], 300, seed=34)
    loner = random_prompts(1, [40], 300, seed=35)[0]
    s = make(path, "lpm", 4096, max_running_requests=1)
    sp = SamplingParams(max_tokens=1, ignore_eos=True)
    s.add_request(0, shared + others[0], sp)
    s.step()  # the shared prompt is cached from now on: every later one matches it
    s.add_request(1, loner, sp)
    for uid, tail in enumerate(others[1:], start=2):
        s.add_request(uid, shared + tail, sp)
    order = admitted_order(s)
    # the loner is passed by later arrivals (they match more), but at most MAX_BYPASS of them
    assert 2 < order.index(1) <= MAX_BYPASS + 1


def test_priority_still_first_under_lpm(path) -> None:
    shared = random_prompts(1, [64], 300, seed=36)[0]
    s = make(path, "lpm", 4096, max_running_requests=1)
    sp = SamplingParams(max_tokens=1, ignore_eos=True)
    s.add_request(0, shared + [5], sp)
    s.step()
    s.add_request(1, shared + [6, 7], SamplingParams(max_tokens=1, ignore_eos=True, priority=1))
    s.add_request(2, [9, 9, 9, 9], SamplingParams(max_tokens=1, ignore_eos=True, priority=-1))
    s.add_request(3, shared + [8], sp)
    assert admitted_order(s) == [0, 2, 3, 1]


def test_cache_aware_policies_need_the_radix_cache() -> None:
    with pytest.raises(ValueError, match="radix"):
        SchedulerConfig(cache="naive", schedule_policy="lpm")
    with pytest.raises(ValueError, match="radix"):
        SchedulerConfig(cache="naive", enable_hierarchical_cache=True)
