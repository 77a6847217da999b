"""`bench offline --phases`: where a timed run's time goes, by kind of step — the prefill batches
(with the decode rows that ride in them) and the decode steps by batch size. A step's time runs
from its launch mark to the next step's (CUDA events on the stream, the wall clock on CPU), so the
step kinds add up to the run, the device's waits for the host included. On the H200 this showed
an FP8 run's decode steps of 193-256 requests at 36% of it and its 18 prefill batches at 12%.

Beside it, the host's own time a step: `Scheduler.step`'s wall time less its wait for the last
batch's tokens. NOTE: a kernel launch that finds the device's queue full waits inside the launch,
and that wait counts here: a host figure near the step's time means either that the device waits
on the host or that the host waits, launching, on a busy device. On the H200 the offline prefill
batches read so; a CUPTI trace found the GPU busy 47% of their time, the host the limit, and
prefill graphs to 8,192 tokens took them from 35-38 to 20-24 ms (docs/benchmarks.md).

And the KV bytes the decode rows read (every decode row attends over its whole context), with
the rate they were read at over each decode band's time: decode attention is bound by those
bytes, so that rate against the GPU's memory bandwidth says how much of a band's time is left
for anything else."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from radixserve.bench.clock import Clock

BANDS = (16, 32, 64, 128, 256)  # decode batch sizes' upper bounds; larger ones share one row
# the table's rows, in order
KINDS = ("prefill", *(f"decode {lo + 1}-{hi}" for lo, hi in zip((0, *BANDS), BANDS)),
         f"decode {BANDS[-1] + 1}+")


def step_kind(prefill_tokens: int, decoding: int) -> str:
    """A step's row: "prefill" when it computed prompt tokens, else its decode batch's band."""
    if prefill_tokens:
        return KINDS[0]
    return KINDS[1 + sum(decoding > hi for hi in BANDS)]


@dataclass
class _Row:
    steps: int = 0
    ms: float = 0.0
    host_ms: float = 0.0
    prompt_tokens: int = 0
    kv_tokens: int = 0


@dataclass
class StepPhases:
    """Filled by `run_scheduler` around each step of the timed run, read by `table`."""

    clock: Clock
    kv_bytes_per_token: int = 0  # this rank's KV bytes a token, all layers
    marks: list[Any] = field(default_factory=list)
    kinds: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, prompt, KV tokens)
    host_ms: list[float] = field(default_factory=list)  # per step, as `kinds`
    _before: tuple[int, int, int, float, float] = (0, 0, 0, 0.0, 0.0)

    @classmethod
    def on(cls, device: torch.device, kv_bytes_per_token: int = 0) -> StepPhases:
        return cls(Clock(device.type == "cuda"), kv_bytes_per_token)

    def before_step(self, sched: Any) -> None:
        self.marks.append(self.clock.mark())
        decoding = sum(1 for r in sched.running if r.prefill_done)
        self._before = (sched.prefill_tokens, sched.decode_kv_tokens, decoding,
                        time.perf_counter(), sched.token_wait_s)

    def after_step(self, sched: Any) -> None:
        tokens, kv_tokens, decoding, start, waited = self._before
        host = 1000 * (time.perf_counter() - start - (sched.token_wait_s - waited))
        prefilled = sched.prefill_tokens - tokens
        if not prefilled and not decoding:
            self.marks.pop()  # nothing launched: its time joins the step before
            if self.host_ms:
                self.host_ms[-1] += host
            return
        self.kinds.append((step_kind(prefilled, decoding), prefilled,
                           sched.decode_kv_tokens - kv_tokens))
        self.host_ms.append(host)

    def finish(self) -> None:
        """The run's end mark (on a GPU, read once the caller has synchronized)."""
        self.marks.append(self.clock.mark())

    def rows(self) -> dict[str, _Row]:
        rows: dict[str, _Row] = {}
        for (kind, tokens, kv), host, start, end in zip(self.kinds, self.host_ms, self.marks,
                                                        self.marks[1:]):
            row = rows.setdefault(kind, _Row())
            row.steps += 1
            row.ms += self.clock.ms(start, end)
            row.host_ms += host
            row.prompt_tokens += tokens
            row.kv_tokens += kv
        return {kind: rows[kind] for kind in KINDS if kind in rows}

    def table(self) -> str:
        rows = self.rows()
        total = sum(r.ms for r in rows.values())
        where = "GPU time (CUDA events)" if self.clock.cuda else "wall clock"
        title = (f"  timed run by kind of step, {where} from each step's launch to the next; "
                 "host: the scheduler's own time a step, its waits for tokens left out "
                 "(launches blocked on a busy device count in it):")
        head = (f"    {'kind':<16} {'steps':>6} {'seconds':>9} {'share':>7} {'ms/step':>9} "
                f"{'host ms/step':>12} {'prompt tokens':>14} {'KV GB read':>11} {'KV TB/s':>8}")
        lines = [title, head]
        for kind, r in rows.items():
            gb = r.kv_tokens * self.kv_bytes_per_token / 1e9
            # the read rate only where decode attention is the step (a prefill row's decode
            # rows share their steps with the prompts' compute)
            rate = f"{gb / max(r.ms, 1e-9):>8.2f}" if kind != KINDS[0] and gb else ""
            lines.append(f"    {kind:<16} {r.steps:>6} {r.ms / 1000:>9.3f} {100 * r.ms / max(total, 1e-9):>6.1f}% "
                         f"{r.ms / r.steps:>9.2f} {r.host_ms / r.steps:>12.2f} {r.prompt_tokens or '':>14} "
                         f"{gb:>11.3f} {rate:>8}")
        lines.append(f"    {'all':<16} {sum(r.steps for r in rows.values()):>6} {total / 1000:>9.3f}")
        return "\n".join(lines)
