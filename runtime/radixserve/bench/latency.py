"""Decode step time at fixed batch sizes: every request past its prompt, timing only decode steps."""
from __future__ import annotations

import time

import torch

from radixserve.bench.breakdown import step_breakdown
from radixserve.bench.profile import maybe_profile
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler


def decode_step_ms(sched: Scheduler, bs: int, input_len: int, steps: int, uid0: int,
                   profile_dir: str | None = None,
                   breakdown: dict[str, float] | None = None) -> float:
    """Mean ms per decode step of `bs` requests; under `profile_dir`, `steps` more steps run
    under the profiler afterwards (bench/profile.py), so its overhead (tens of ms per step on a
    GPU) stays out of the figure. A `breakdown` dict is filled with `steps` more eager steps'
    time by layer part (bench/breakdown.py), also after the timed ones."""
    g = torch.Generator().manual_seed(bs)
    runs = 1 + bool(profile_dir) + (breakdown is not None)  # timed, profiled, broken down
    for i in range(bs):
        ids = torch.randint(1, min(1000, sched.vocab_size), (input_len,), generator=g).tolist()
        sched.add_request(uid0 + i, ids, SamplingParams(max_tokens=runs * steps + 8, ignore_eos=True))
    while sched.waiting or any(not r.prefill_done for r in sched.running):
        sched.step()
    for _ in range(4):  # settle the overlap pipeline on pure decode
        sched.step()
    sync = torch.cuda.synchronize if sched.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        sched.step()
    sync()
    ms = (time.perf_counter() - start) * 1000 / steps
    if profile_dir:
        with maybe_profile(profile_dir, f"decode-bs{bs}", steps, sched.device.type == "cuda"):
            for _ in range(steps):
                sched.step()
            sync()
    if breakdown is not None:
        breakdown.update(step_breakdown(sched, steps))
    for r in list(sched.running):
        sched.abort(r.uid)
    while sched.has_work:
        sched.step()
    return ms
