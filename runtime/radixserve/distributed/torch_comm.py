"""torch.distributed collectives: NCCL (GPU) or gloo (CPU) for tensors, and always a gloo group
for host-side control messages, so the request broadcast never touches the GPU stream."""
from __future__ import annotations

import datetime
import logging
import os
import sys
import threading

import torch
import torch.distributed as dist

from radixserve import settings
from radixserve.distributed.allreduce_choice import (
    NCCL,
    AllReducePolicy,
    is_aligned,
    policy_from_env,
)
from radixserve.distributed.comm import BaseCommunicator, set_comm
from radixserve.distributed.info import get_tp_info, set_tp_info
from radixserve.distributed.symm_allreduce import SymmAllReduce, try_symm_allreduce

# an idle server may wait for its next request for days; a dead peer still fails fast (closed socket)
CONTROL_TIMEOUT = datetime.timedelta(days=30)
INIT_WARN_S = 120  # forming the group takes seconds; say so in the log if it takes minutes
INIT_TIMEOUT_ENV = settings.TP_INIT_TIMEOUT_S.name
SHUTDOWN_TIMEOUT_S = 30.0

logger = logging.getLogger(__name__)


class TorchCommunicator(BaseCommunicator):
    """`fast`: the symmetric-memory all-reduce (CUDA, NVLink), used where its policy picks it;
    NCCL (or gloo on CPU) for everything else."""

    def __init__(self, size: int, control: dist.ProcessGroup, fast: SymmAllReduce | None = None) -> None:
        self.size, self.control, self.fast = size, control, fast

    def all_reduce_kind(self, x: torch.Tensor) -> str:
        """What `all_reduce(x)` runs: "nccl" (the process group's backend), "one_shot" or "two_shot"."""
        if self.fast is None:
            return NCCL
        return self.fast.policy.pick(x.numel() * x.element_size(), x.dtype, is_aligned(x), True)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        kind = self.all_reduce_kind(x)
        if kind != NCCL:
            return self.fast.all_reduce(x, kind)
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=dim)

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        n = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
        dist.broadcast(n, src=0, group=self.control)
        buf = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload is not None
               else torch.empty(int(n.item()), dtype=torch.uint8))
        if n.item():
            dist.broadcast(buf, src=0, group=self.control)
        return buf.numpy().tobytes()


def init_timeout_s() -> float:
    """How long a rank waits for the others to join: `RADIXSERVE_TP_INIT_TIMEOUT_S`, default 600."""
    return settings.TP_INIT_TIMEOUT_S.get()


_SYMM_USED = False  # this process has made a symmetric-memory buffer (see _agree_on_symm)


def _agree_on_symm(comm: TorchCommunicator, policy: AllReducePolicy, rank: int, size: int,
                   device: torch.device, group_name: str = "") -> SymmAllReduce | None:
    """The symmetric-memory all-reduce on every rank, or on none: the ranks must pick the same
    kernel for the same tensor, and making the buffer is a collective, so the ranks agree (MIN
    over the control group) before making it and again after.

    NOTE: once per process. A second TP group in the same process (tests, a bench with several
    runs) that made a buffer again hung on two H200s (torch 2.11: the second group's pytest case
    printed nothing for 150 s; the group name "0" comes back after a teardown). A later group in
    this process uses NCCL and says so."""
    global _SYMM_USED
    wanted = device.type == "cuda" and policy.wants_symm_mem
    if comm.min_int(1 if wanted and not _SYMM_USED else 0) == 0:
        if wanted and _SYMM_USED:
            logger.warning("tensor-parallel rank %d: this process already made a symmetric-memory "
                           "buffer for an earlier group; using NCCL", rank)
        return None
    _SYMM_USED = True
    fast = try_symm_allreduce(policy, rank, size, device, group_name)
    if comm.min_int(1 if fast is not None else 0) == 1:
        return fast
    if fast is not None:
        logger.warning("tensor-parallel rank %d: a peer has no symmetric-memory all-reduce; "
                       "all ranks use NCCL", rank)
    return None


def init_tp(rank: int, size: int, init_method: str, device: torch.device) -> None:
    """Join the TP group (blocks until every rank has joined) and install the communicator."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (see docs)
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")  # nor through symmetric memory
    policy = policy_from_env()  # a bad RADIXSERVE_ALLREDUCE fails before the group forms
    if sys.platform == "linux":
        # Every rank runs on this host. Left alone, gloo binds to the address the hostname resolves
        # to; on a sandboxed host that address may be unreachable, and gloo retries until the
        # (30-day) timeout instead of failing.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    backend = "nccl" if device.type == "cuda" else "gloo"
    limit = init_timeout_s()  # before the timer: a bad value must not leave it running
    msg = ("tensor-parallel rank %d: the group of %d has not formed after %d s (a rank still "
           "loading, or a network problem: GLOO_SOCKET_IFNAME=%s, NCCL_SOCKET_IFNAME=%s)")
    slow = threading.Timer(INIT_WARN_S, logger.warning, args=(
        msg, rank, size, INIT_WARN_S, os.environ.get("GLOO_SOCKET_IFNAME"),
        os.environ.get("NCCL_SOCKET_IFNAME")))
    slow.daemon = True
    slow.start()
    try:
        # the group's own timeout bounds forming it (and each tensor collective, which the ranks
        # reach in lockstep); control messages get their own group, which may idle for days
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=limit),
                                device_id=device if device.type == "cuda" else None)
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    except RuntimeError as e:
        raise RuntimeError(
            f"tensor-parallel rank {rank}: the group of {size} did not form within {limit:g} s "
            f"({e}); a rank failed to start (see its log) or cannot reach this one "
            f"({INIT_TIMEOUT_ENV} sets the limit)") from e
    finally:
        slow.cancel()
    set_tp_info(rank, size)
    comm = TorchCommunicator(size, control)
    comm.fast = _agree_on_symm(comm, policy, rank, size, device, dist.group.WORLD.group_name)
    if device.type == "cuda":
        logger.info("tensor-parallel rank %d: all-reduce %s (%s=%s)", rank,
                    "symmetric memory, NCCL above its limits" if comm.fast else "NCCL",
                    "RADIXSERVE_ALLREDUCE", policy.mode)
    set_comm(comm)


def _leave(abort: bool) -> None:
    if not dist.is_initialized():
        # A group that failed to form leaves torch's group counter (part of each group's name)
        # advanced, and only destroy_process_group() resets it: without this, the fresh ranks of
        # the next group would look for other names and wait forever.
        dist.distributed_c10d._world.group_count = 0
    elif abort and dist.get_backend() == "nccl":
        dist.distributed_c10d._abort_process_group()  # a peer is gone: nothing to agree with
    else:
        dist.destroy_process_group()  # gloo: local; NCCL: every rank calls it at once


def _forget_groups() -> None:
    """Drop torch's Python-side record of the groups, as `_abort_process_group` does after its
    aborts, without touching the communicators (a thread is stuck in them): the process can
    form a new group, at the cost of the stuck one's resources."""
    c10d = dist.distributed_c10d
    c10d._update_default_pg(None)
    w = c10d._world
    for table in (w.pg_map, w.pg_names, w.pg_group_ranks, w.pg_backend_config, w.pg_to_tag,
                  w.tags_to_pg, w.pg_coalesce_state):
        table.clear()
    c10d._unregister_all_process_groups()
    w.group_count = 0


def shutdown_tp(abort: bool = False, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Leave the TP group and return to the TP=1 identity (a new group may be joined later).
    Every rank calls this at the same point of the same exchange (after the `exit` broadcast),
    since NCCL's destroy waits on its peers; with `abort` (a peer is gone) NCCL communicators are
    aborted instead. Either way this returns within `timeout_s`: a teardown that does not is
    logged and abandoned (the process is about to exit, or the next group says why it cannot form)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _leave(abort)
        except Exception as e:  # noqa: BLE001 -- reported below; teardown must not raise
            errors.append(e)

    t = threading.Thread(target=run, name="tp-shutdown", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        logger.warning("tensor-parallel rank %d: leaving the group did not finish within %g s; "
                       "going on without it", get_tp_info().rank, timeout_s)
        _forget_groups()
    elif errors:
        logger.warning("tensor-parallel rank %d: leaving the group failed: %s",
                       get_tp_info().rank, errors[0])
    set_tp_info(0, 1)
    set_comm(BaseCommunicator())


def abort_tp() -> None:
    """From another thread, when a peer has died: make a collective blocked on it return with an
    error. NCCL only (its kernels would wait for the peer until the group's timeout); gloo
    notices the closed socket by itself."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception as e:  # noqa: BLE001 -- best effort: the caller fails loudly anyway
            logger.warning("aborting the NCCL communicators failed: %s", e)
