"""Priorities (`SamplingParams.priority`, lower first, vLLM's): requests that wait for KV are
admitted in priority order, arrival order among equals; a running request is never preempted."""
from __future__ import annotations

import pytest

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler


def test_waiting_requests_are_admitted_by_priority_then_arrival(tiny_ckpts) -> None:
    # 256 KV tokens: each request reserves 10 + 140, so only one runs at a time
    s = Scheduler(EngineConfig(model=str(tiny_ckpts["llama"]), dtype="float32", device="cpu",
                               max_kv_tokens=256), SchedulerConfig(max_running_requests=4))
    order = [("first", 5), ("late-normal", 0), ("urgent", -1), ("urgent-too", -1), ("lazy", 3)]
    for uid, (_, prio) in enumerate(order):
        s.add_request(uid, [7 + uid] * 10, SamplingParams(max_tokens=140, ignore_eos=True,
                                                          priority=prio))
        if uid == 0:
            s.step()  # "first" is running before the others arrive, whatever its priority
    started: list[int] = []
    while s.has_work:
        for o in s.step():
            if o.uid not in started:
                started.append(o.uid)
        assert len(s.running) <= 1
    assert [order[u][0] for u in started] == ["first", "urgent", "urgent-too", "late-normal", "lazy"]
    s.check_integrity()


def test_priority_must_be_a_32_bit_integer() -> None:
    with pytest.raises(ValueError, match="^priority"):
        SamplingParams(priority=2**31)
    with pytest.raises(ValueError, match="^priority"):
        SamplingParams(priority=1.5)  # type: ignore[arg-type]
