"""Scheduler behaviour: overlap on/off equality and its two upstream bugs, aborts in every state,
finishing rules, and bad input rejected before it reaches the batch."""
from __future__ import annotations

import pytest

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import drain, random_prompts


def make(path, overlap: bool, **sched) -> Scheduler:
    eng = EngineConfig(model=str(path), dtype="float32", device="cpu", page_size=4)
    return Scheduler(eng, SchedulerConfig(**{"max_running_requests": 4, "overlap": overlap, **sched}))




@pytest.fixture(scope="module")
def path(tiny_ckpts):
    return tiny_ckpts["llama"]


def run_all(s: Scheduler, prompts, max_tokens) -> dict[int, list]:
    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        s.add_request(i, p, SamplingParams(max_tokens=m, ignore_eos=True))
    return drain(s)


def test_overlap_gives_same_tokens_and_exact_max_tokens(path) -> None:
    # more requests than rows, uneven lengths: rows are reused while batches are in flight
    prompts = random_prompts(10, [3, 50, 9, 120, 1, 33], 300, seed=3)
    max_tokens = [1, 2, 7, 3, 11, 5, 1, 9, 4, 6]
    res = {}
    for overlap in (False, True):
        s = make(path, overlap, max_prefill_length=48)
        out = run_all(s, prompts, max_tokens)
        res[overlap] = {u: [o.token_id for o in outs] for u, outs in out.items()}
        for uid, outs in out.items():
            assert len(outs) == max_tokens[uid], "max_tokens counted off by one step"
            assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
            assert outs[-1].finish_reason == "length"
        s.check_integrity()
        assert s.stats()["protected_tokens"] == 0 and s.stats()["running"] == 0
    assert res[True] == res[False]


def test_overlap_keeps_finished_row_until_inflight_batch_done(path) -> None:
    s = make(path, overlap=True)
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))
    s.add_request(1, [8, 9], SamplingParams(max_tokens=6, ignore_eos=True))
    seen_deferred = False
    while s.has_work:
        rows = {r.uid: r.row for r in s.running}
        for o in s.step():
            if o.finished and o.uid == 0:
                # batch N+1 (in flight) still writes request 0's row and KV
                assert s._inflight is not None and any(r.uid == 0 for r in s._deferred)
                assert rows[0] not in s.table._free
                seen_deferred = True
        s.check_integrity()
    assert seen_deferred


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_in_every_state(path, overlap) -> None:
    s = make(path, overlap, max_prefill_length=16, max_running_requests=2)
    long_prompt = random_prompts(1, [100], 300, seed=4)[0]
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    s.add_request(0, long_prompt, sp)  # chunked: 100 tokens at 16 per batch
    s.add_request(1, [4, 5, 6], sp)
    s.add_request(2, [7, 8], sp)  # waits: only two rows
    s.add_request(3, [9, 10, 11], sp)
    s.step()
    assert not s.reqs[0].prefill_done
    s.abort(0)  # mid-prefill, possibly in flight
    s.abort(2)  # waiting
    s.abort(2)  # twice
    s.abort(99)  # unknown
    out = drain(s)
    assert 0 not in out and 2 not in out
    assert len(out[1]) == 30 and len(out[3]) == 30
    s.abort(1)  # finished already: a no-op
    s.check_integrity()
    st = s.stats()
    assert st["running"] == st["waiting"] == st["protected_tokens"] == 0
    assert st["kv_pages_used"] * 4 == st["evictable_tokens"]  # all that is held is the cache


def test_eos_and_stop_token_finish(path) -> None:
    s = make(path, overlap=False)
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
    first = drain(s)[0]
    stop_tok = first[2].token_id
    s.add_request(1, [5, 6, 7], SamplingParams(max_tokens=8, stop_token_ids=[stop_tok]))
    outs = drain(s)[1]
    cut = [o.token_id for o in first].index(stop_tok) + 1
    assert [o.token_id for o in outs] == [o.token_id for o in first][:cut]
    assert outs[-1].finish_reason == "stop"
    s.eos_ids = {stop_tok}
    s.add_request(2, [5, 6, 7], SamplingParams(max_tokens=8))
    assert [o.token_id for o in drain(s)[2]] == [o.token_id for o in first][:cut]


@pytest.mark.parametrize("bad,field", [
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [10**7]}, "input_ids"),
    ({"max_tokens": 5000}, "max_tokens"),
])
def test_bad_requests_rejected_with_field_name(path, bad, field) -> None:
    s = make(path, overlap=False)
    args = {"input_ids": [1, 2, 3], "max_tokens": 4, **bad}
    with pytest.raises(ValueError, match=field):
        s.add_request(0, args["input_ids"], SamplingParams(max_tokens=args["max_tokens"]))
    assert not s.has_work


@pytest.mark.parametrize("kw,field", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_k": 0}, "top_k"), ({"min_p": 2.0}, "min_p"),
    ({"seed": -3}, "seed"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
])
def test_sampling_params_validation(kw, field) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)
