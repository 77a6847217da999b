"""One-shot and two-shot all-reduce over NVLink peer memory, through PyTorch's symmetric memory
(`torch.ops.symm_mem`): one buffer per rank, mapped into every peer's address space once; each
call copies the input into it and launches one kernel that synchronises the ranks through signal
pads. Plain kernel launches on fixed pointers, so they are captured in the decode CUDA graphs.

NVLink multicast stays off (the `multimem_*` ops are never used; TORCH_SYMM_MEM_DISABLE_MULTICAST
is set before the buffer is made): on a shared host it can take the GPUs out of service."""
from __future__ import annotations

import logging
import os

import torch

from radixserve.distributed.allreduce_choice import ONE_SHOT, TWO_SHOT, AllReducePolicy

logger = logging.getLogger(__name__)


def _register_group(name: str) -> None:
    """Older PyTorch builds need the group registered for symmetric memory first; 2.11 resolves
    the process group by its name itself (a private name fails there: "Could not resolve the
    process group registered under the name ...", seen on two H200s)."""
    import warnings

    import torch.distributed._symmetric_memory as symm

    try:
        with warnings.catch_warnings():  # 2.11 warns that it is no longer needed
            warnings.simplefilter("ignore", FutureWarning)
            symm.enable_symm_mem_for_group(name)
    except Exception as e:  # noqa: BLE001 -- the rendezvous below says whether it matters
        logger.debug("enable_symm_mem_for_group(%s): %s", name, e)


class SymmAllReduce:
    """The buffer and the two kernels. Construct on every rank at once (a collective)."""

    def __init__(self, policy: AllReducePolicy, rank: int, size: int, device: torch.device,
                 group_name: str) -> None:
        import torch.distributed._symmetric_memory as symm

        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        self.policy, self.group_name, self.device = policy, group_name, device
        _register_group(group_name)
        with torch.cuda.device(device):
            self.buffer = symm.empty(policy.buffer_bytes, dtype=torch.uint8, device=device)
            self.handle = symm.rendezvous(self.buffer, group_name)
        ops = torch.ops.symm_mem
        # the fused copy-in variants save one launch; older builds have only the plain ops
        self._one_shot_copy = getattr(ops, "one_shot_all_reduce_copy_out", None)
        self._two_shot_out = getattr(ops, "two_shot_all_reduce_out", None)

    def _staged(self, x: torch.Tensor) -> torch.Tensor:
        return self.buffer[: x.numel() * x.element_size()].view(x.dtype)

    def all_reduce(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        """Sum `x` over the ranks in place with the `kind` kernel; `x` must pass
        `allreduce_choice.is_aligned` and fit the buffer (the policy checked both)."""
        flat = x.view(-1)
        buf = self._staged(flat)
        ops = torch.ops.symm_mem
        if kind == ONE_SHOT:
            if self._one_shot_copy is not None:
                # copies x into the buffer, barrier, reads every peer's buffer into x
                self._one_shot_copy(buf, flat, "sum", self.group_name, flat)
            else:
                buf.copy_(flat)
                ops.one_shot_all_reduce_out(buf, "sum", self.group_name, flat)
        elif kind == TWO_SHOT:
            buf.copy_(flat)
            if self._two_shot_out is not None:
                self._two_shot_out(buf, "sum", self.group_name, flat)
            else:
                ops.two_shot_all_reduce_(buf, "sum", self.group_name)
                flat.copy_(buf)
        else:
            raise ValueError(f"not a symmetric-memory all-reduce: {kind!r}")
        return x


def try_symm_allreduce(policy: AllReducePolicy, rank: int, size: int, device: torch.device,
                       group_name: str) -> SymmAllReduce | None:
    """The symmetric-memory all-reduce, or None (NCCL for everything) where it cannot be had: not
    CUDA, not wanted, or PyTorch failed to make the buffer (logged with its error). Every rank
    reaches the same answer only if they fail alike, so the caller agrees on it over the group."""
    if device.type != "cuda" or not policy.wants_symm_mem:
        return None
    try:
        fast: SymmAllReduce | None = SymmAllReduce(policy, rank, size, device, group_name)
    except Exception as e:  # noqa: BLE001 -- any failure here means: use NCCL
        logger.warning("tensor-parallel rank %d: symmetric-memory all-reduce unavailable, using "
                       "NCCL: %s: %s", rank, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        fast = None
    return fast
