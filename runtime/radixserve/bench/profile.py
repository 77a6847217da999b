"""`--profile DIR` for the benches: torch.profiler around the timed steps, a Chrome trace per run
and the operations (CUDA kernels on a GPU, CPU ops on CPU) that take a step's time, per step."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch


def _device_us(e) -> float:
    """The event's own device time in µs (torch renamed the field from `cuda` to `device`)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(e, name):
            return float(getattr(e, name))
    return 0.0


def top_ops(prof: torch.profiler.profile, steps: int, on_gpu: bool, limit: int = 15) -> str:
    """A table of the operations with the most self time per step: µs per step, calls per step,
    share of the step. On a GPU: device time, so kernels launched by a graph replay count too."""
    rows = []
    for e in prof.key_averages():
        us = _device_us(e) if on_gpu else float(e.self_cpu_time_total)
        if us > 0:
            rows.append((us / steps, e.count / steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) or 1.0
    kind = "device" if on_gpu else "CPU"
    head = (f"  {'µs/step':>9} {'calls/step':>10} {'share':>6}  {kind} op (self time; "
            f"all ops {total:.1f} µs/step)")
    lines = [head]
    lines += [f"  {us:9.1f} {calls:10.1f} {100 * us / total:5.1f}%  {key[:90]}"
              for us, calls, key in rows[:limit]]
    return "\n".join(lines)


@contextlib.contextmanager
def maybe_profile(out_dir: str | None, label: str, steps: int,
                  on_gpu: bool) -> Iterator[None]:
    """Profile the block when `out_dir` is given: write `out_dir/label.json` (chrome://tracing,
    Perfetto) and print the top operations per step."""
    if out_dir is None:
        yield
        return
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # else kineto prints start/stop lines
    acts = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        yield
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path / f"{label}.json"))
    print(f"profile {label} ({path / (label + '.json')}):\n{top_ops(prof, steps, on_gpu)}", flush=True)
