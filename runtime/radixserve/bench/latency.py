"""Decode step time at fixed batch sizes: every request past its prompt, timing only decode steps."""
from __future__ import annotations

import time

import torch

from radixserve.bench.breakdown import step_breakdown
from radixserve.bench.clock import device_sync
from radixserve.bench.profile import maybe_profile
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler


def _decode_batch(sched: Scheduler, bs: int, input_len: int, max_tokens: int, uid0: int,
                  loras: list[str] | None = None) -> None:
    """`bs` requests of `input_len` random tokens, prefilled, then decoding: the overlap pipeline
    settled on pure decode steps, and the device idle. `loras`: request i runs with adapter
    i mod their number."""
    g = torch.Generator().manual_seed(bs)
    for i in range(bs):
        ids = torch.randint(1, min(1000, sched.vocab_size), (input_len,), generator=g).tolist()
        sched.add_request(uid0 + i, ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                          lora=loras[i % len(loras)] if loras else None)
    while sched.waiting or any(not r.prefill_done for r in sched.running):
        sched.step()
    for _ in range(4):
        sched.step()
    device_sync(sched.device)


def _end_batch(sched: Scheduler) -> None:
    for r in list(sched.running):
        sched.abort(r.uid)
    while sched.has_work:
        sched.step()


def decode_step_ms(sched: Scheduler, bs: int, input_len: int, steps: int, uid0: int,
                   loras: list[str] | None = None) -> float:
    """Mean ms per decode step of `bs` requests past a prompt of `input_len` tokens (spread over
    the LoRA adapters `loras`, if given)."""
    _decode_batch(sched, bs, input_len, steps + 8, uid0, loras)
    start = time.perf_counter()
    for _ in range(steps):
        sched.step()
    device_sync(sched.device)
    ms = (time.perf_counter() - start) * 1000 / steps
    _end_batch(sched)
    return ms


def decode_step_detail(sched: Scheduler, bs: int, input_len: int, steps: int, uid0: int,
                       profile_dir: str | None = None, breakdown: bool = False) -> dict[str, float] | None:
    """`steps` decode steps of such a batch under the profiler (with `profile_dir`;
    bench/profile.py), then with `breakdown` as many eager steps timed by layer part
    (bench/breakdown.py), whose table is returned (else None). Run it after every timed batch
    size, on its own requests. On the H200, batch 256 timed after batch 1's breakdown, with
    requests made longer for the breakdown, took 5.20 ms a step where it takes 4.77 (FP8 cache)."""
    _decode_batch(sched, bs, input_len, 2 * steps + 8, uid0)
    if profile_dir:
        with maybe_profile(profile_dir, f"decode-bs{bs}", steps, sched.device.type == "cuda"):
            for _ in range(steps):
                sched.step()
            device_sync(sched.device)
    parts = step_breakdown(sched, steps) if breakdown else None
    _end_batch(sched)
    return parts
