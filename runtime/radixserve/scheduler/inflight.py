"""A launched batch whose sampled tokens are still on their way to the host."""
from __future__ import annotations

from typing import NamedTuple

import torch

from radixserve.engine.batch import Batch
from radixserve.engine.sampler import SampleResult
from radixserve.scheduler.req import Req


class ForwardPass(NamedTuple):
    """A batch whose forward is launched, not yet sampled."""

    items: list[tuple[Req, int]]
    emits: list[int]  # indices of items that finished their prompt: they sample a token
    batch: Batch
    logits: torch.Tensor  # [bs, vocab], one row per item

    @property
    def constrained(self) -> bool:
        return any(self.items[i][0].grammar is not None for i in self.emits)


class InFlight(NamedTuple):
    items: list[tuple[Req, int]]
    emits: list[int]  # indices of items that finished their prompt: they produce a token
    host: SampleResult  # the sample copied into host memory (pinned on CUDA, filled async)
    event: torch.cuda.Event | None  # recorded after the copy; None on CPU

    def wait(self) -> SampleResult:
        if self.event is not None:
            self.event.synchronize()
        return self.host


def copy_to_host(res: SampleResult) -> tuple[SampleResult, torch.cuda.Event | None]:
    if res.tokens.device.type != "cuda":
        return res, None

    def cp(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return out.copy_(t, non_blocking=True)

    host = SampleResult(*(cp(t) for t in res))
    event = torch.cuda.Event()
    event.record()
    return host, event
