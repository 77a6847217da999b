"""Which all-reduce runs a given tensor: PyTorch's symmetric-memory one-shot or two-shot kernels
over NVLink peer memory, or NCCL. Pure decisions on sizes and dtypes, so they are tested on CPU.

NCCL costs ~15 µs per all-reduce on two H200s even for 10 KiB (docs/benchmarks.md), which is most
of a small-batch decode step at TP=2. The one-shot kernel has every rank read every peer's buffer
and sum (one barrier-bounded pass: cheapest for small messages); the two-shot kernel
reduce-scatters then all-gathers (less traffic per rank: better for mid sizes); NCCL wins for large
messages (prefill) and is the only choice on CPU (gloo). The byte limits are from
`radixserve bench allreduce` on two H200s (docs/benchmarks.md)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve import settings

ENV = settings.ALLREDUCE.name
MODES = settings.ALLREDUCE.choices
NCCL, ONE_SHOT, TWO_SHOT = "nccl", "one_shot", "two_shot"
# dtypes PyTorch's one-/two-shot kernels dispatch on (AT_DISPATCH_FLOAT_AND_BFLOAT16)
SYMM_DTYPES = (torch.bfloat16, torch.float32)
ALIGN = 16  # the kernels vectorise by 16 bytes when pointer and size allow; we require it


@dataclass(frozen=True)
class AllReducePolicy:
    """`mode` auto picks by size; one_shot/two_shot force that kernel wherever it can run (the
    buffer holds the tensor, dtype and alignment fit); nccl never builds the buffer."""
    mode: str = "auto"
    one_shot_max_bytes: int = 2 * 1024 * 1024  # a decode step up to batch 204 of hidden 5120, bf16
    two_shot_max_bytes: int = 8 * 1024 * 1024  # 0: two-shot is never picked by auto
    buffer_bytes: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"{ENV} must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.buffer_bytes < 0 or self.one_shot_max_bytes < 0 or self.two_shot_max_bytes < 0:
            raise ValueError("all-reduce byte limits must not be negative")

    @property
    def wants_symm_mem(self) -> bool:
        return self.mode != NCCL and self.buffer_bytes > 0

    def pick(self, nbytes: int, dtype: torch.dtype, aligned: bool, symm_ready: bool) -> str:
        """The kernel for one all-reduce of `nbytes` of `dtype`; `aligned`: contiguous, with data
        pointer and size multiples of 16 bytes; `symm_ready`: this rank holds the buffer."""
        if (not symm_ready or self.mode == NCCL or dtype not in SYMM_DTYPES or not aligned
                or nbytes == 0 or nbytes > self.buffer_bytes):
            return NCCL
        if self.mode in (ONE_SHOT, TWO_SHOT):
            return self.mode
        if nbytes <= self.one_shot_max_bytes:
            return ONE_SHOT
        if nbytes <= self.two_shot_max_bytes:
            return TWO_SHOT
        return NCCL


def is_aligned(x: torch.Tensor) -> bool:
    return (x.is_contiguous() and x.data_ptr() % ALIGN == 0
            and (x.numel() * x.element_size()) % ALIGN == 0)


def policy_from_env() -> AllReducePolicy:
    """`RADIXSERVE_ALLREDUCE` = auto (default) | nccl | one_shot | two_shot. The GPU tier's TP=2
    tests run with auto, so the default is the proven path."""
    return AllReducePolicy(mode=settings.ALLREDUCE.get())
