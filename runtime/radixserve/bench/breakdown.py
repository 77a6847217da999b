"""`bench latency --breakdown`: where an eager decode step's forward goes, layer part by layer
part, all layers together. On a GPU each step's forward starts behind a sleep kernel long enough
for the host to queue the whole forward first, so CUDA events around each part time the GPU
alone (without it, an eager step's launch gaps would be counted in). On CPU, where a step runs as it is issued,
the wall clock. The profiler's kernel sums inside a graph replay fell short of the step on the
H200 (docs/benchmarks.md); events around the parts of an eager step do not."""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from radixserve.bench.clock import Clock

# timed modules, by attribute name; a module inside another timed one counts as the outer part
PARTS = {
    "embed_tokens": "embedding",
    "input_layernorm": "RMSNorm (with residual add)",
    "post_attention_layernorm": "RMSNorm (with residual add)",
    "qkv_proj": "qkv_proj",
    "rotary_emb": "rotary + KV store (+ q/k norm)",
    "attn": "attention",
    "o_proj": "o_proj",
    "gate_up_proj": "gate_up_proj",
    "act_fn": "SiLU-and-mul",
    "down_proj": "down_proj",
    "norm": "final RMSNorm",
    "lm_head": "lm_head",
}
# by class: a MoE layer's experts run as a function of their weights, not as a module call
CLASS_PARTS = {"SparseMoeBlock": "MoE block (router, top-k, experts)"}
SLEEP_MS = 30.0  # at least; raised to twice the host's time for one eager step


@contextlib.contextmanager
def timed_parts(model: nn.Module, clock: Clock) -> Iterator[list[list[Any]]]:
    """While active, every call of one of the model's PARTS appends [label, start, end]."""
    marks: list[list[Any]] = []
    depth = [0]
    handles = []

    def pre(label: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            if depth[0] == 0:
                marks.append([label, clock.mark(), None])
            depth[0] += 1
        return hook

    def post(module: nn.Module, args: Any, out: Any) -> None:
        depth[0] -= 1
        if depth[0] == 0:
            marks[-1][2] = clock.mark()

    for name, module in model.named_modules():  # a shared module (rotary) once: its hooks fire per call
        label = CLASS_PARTS.get(type(module).__name__) or PARTS.get(name.rsplit(".", 1)[-1])
        if label is not None:
            handles += [module.register_forward_pre_hook(pre(label)),
                        module.register_forward_hook(post)]
    try:
        yield marks
    finally:
        for h in handles:
            h.remove()


def _sleep_cycles(ms: float) -> int:
    """Cycles of `torch.cuda._sleep` that last about `ms` on this GPU (timed once)."""
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    torch.cuda.synchronize()
    return int(probe * ms / max(start.elapsed_time(end), 1e-3))


def step_breakdown(sched: Any, steps: int) -> dict[str, float]:
    """Median ms per step of each part over `steps` eager decode steps of the scheduler's running
    batch, plus "forward" (first part's start to last part's end) and "between the parts". The
    engine's CUDA graphs are bypassed for these steps and restored after."""
    engine = sched.engine
    cuda = sched.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = Clock(cuda)
    runner, engine.graph_runner = engine.graph_runner, None
    sleep = None
    per_step: list[Counter[str]] = []
    forward: list[float] = []
    try:
        with timed_parts(engine.model, clock) as marks:
            sched.step()  # one eager step first: compiles, and times the host for the sleep
            sync()
            start = time.perf_counter()
            sched.step()
            host_ms = (time.perf_counter() - start) * 1000
            if cuda:  # at the forward's start, after the batch's copies to the device
                cycles = _sleep_cycles(max(SLEEP_MS, 2 * host_ms))
                sleep = engine.model.register_forward_pre_hook(lambda m, a: torch.cuda._sleep(cycles))
            for _ in range(steps):
                sync()
                marks.clear()
                sched.step()
                sync()
                done = [m for m in marks if m[2] is not None]
                if not done:
                    continue
                parts: Counter[str] = Counter()
                for label, a, b in done:
                    parts[label] += clock.ms(a, b)
                per_step.append(parts)
                forward.append(clock.ms(done[0][1], done[-1][2]))
    finally:
        engine.graph_runner = runner
        if sleep is not None:
            sleep.remove()
    if not per_step:
        return {}
    labels = dict.fromkeys(label for parts in per_step for label in parts)
    out = {label: statistics.median(p.get(label, 0.0) for p in per_step) for label in labels}
    out["forward"] = statistics.median(forward)
    out["between the parts"] = max(0.0, out["forward"] - sum(out[label] for label in labels))
    return out


def format_breakdown(parts: dict[str, float], on_gpu: bool) -> str:
    """The table `bench latency --breakdown` prints under a batch size's line."""
    if not parts:
        return "  breakdown: no decode step ran"
    total = parts["forward"]
    how = "GPU time (CUDA events, the host queued ahead)" if on_gpu else "wall clock"
    lines = [f"  eager forward by part, ms per step, {how}:"]
    named = [(ms, label) for label, ms in parts.items() if label not in ("forward", "between the parts")]
    for ms, label in sorted(named, reverse=True):
        lines.append(f"    {label:34s} {ms:8.3f}  {100 * ms / total:5.1f}%")
    lines.append(f"    {'between the parts':34s} {parts['between the parts']:8.3f}")
    lines.append(f"    {'forward':34s} {total:8.3f}")
    return "\n".join(lines)
