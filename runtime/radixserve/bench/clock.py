"""Marks on the GPU's stream (CUDA events) or on the host's clock (CPU), for the benchmarks that
time parts of a run: on a GPU a mark is where the stream reaches it, not where the host was."""
from __future__ import annotations

import time
from typing import Any

import torch


def device_sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU, where work runs as it is issued)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two marks (on a GPU, once both have been reached)."""
        return start.elapsed_time(end) if self.cuda else (end - start) * 1000
