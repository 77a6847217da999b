"""Tensor parallelism for the scheduler: every rank runs an identical `Scheduler` over its shard.
Rank 0 takes requests; before each step it broadcasts the commands it accepted since the last one
(msgpack over the gloo control group: a collective, so nothing is dropped however late a rank
joins), and every rank applies them and steps in lockstep. Logits are all-gathered, so every rank
samples the same tokens; only rank 0 reports them. Which grammar-constrained requests are ready to
queue is rank 0's decision too (`grammar` command): each rank compiles on its own threads, so
"compiled yet?" would differ between ranks."""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import msgpack

from radixserve.core.output import TokenOutput
from radixserve.distributed import get_comm
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler

if TYPE_CHECKING:
    from radixserve.scheduler.tp_ranks import RankProcesses

logger = logging.getLogger(__name__)


def _encode(cmds: list[list]) -> bytes:
    return msgpack.packb(cmds)


def _apply(sched: Scheduler, cmds: list[list]) -> bool:
    """Apply broadcast commands on a follower; False once told to exit."""
    for cmd in cmds:
        if cmd[0] == "add":
            sched.add_request(cmd[1], cmd[2], SamplingParams(**cmd[3]))
        elif cmd[0] == "abort":
            sched.abort(cmd[1])
        elif cmd[0] == "grammar":  # ["grammar", compiled on rank 0, failed on rank 0]
            sched.drop_grammars(cmd[2])
            if failed := sched.admit_grammars(cmd[1]):  # waits for this rank's compilations
                raise RuntimeError(f"the grammars of requests {failed} compiled on rank 0 but "
                                   f"not on this rank (see its log)")
        elif cmd[0] == "exit":
            return False
    return True


def release_cuda_graphs(sched: Scheduler) -> None:
    """NOTE: a captured NCCL collective keeps a reference on its communicator until its graph is
    destroyed, and NCCL's finalize (inside destroy_process_group) waits for those references:
    with the decode graphs alive, leaving the group hung on every rank (seen on two H200s). The
    scheduler cannot step afterwards; it is being torn down."""
    runners = [getattr(sched.engine, name, None) for name in ("graph_runner", "prefill_graphs")]
    if all(r is None for r in runners):
        return
    import torch

    torch.cuda.synchronize(sched.device)
    for r in runners:
        if r is not None:
            r.destroy()
    sched.engine.graph_runner = sched.engine.prefill_graphs = None


class LeaderLost(RuntimeError):
    """A follower's exchange with rank 0 failed: rank 0 is gone."""


class TPLeader:
    """Rank 0's face: the `Scheduler` interface, plus the broadcast to the followers and the
    group's teardown (`close`)."""

    def __init__(self, sched: Scheduler, ranks: RankProcesses | None = None,
                 init_method: str | None = None) -> None:
        self.sched, self.ranks, self.init_method = sched, ranks, init_method
        sched.auto_admit_grammars = False  # step() admits, and broadcasts what it did
        self._pending: list[list] = []
        self._closed = False

    @property
    def followers(self) -> list:
        """The followers' `multiprocessing.Process` objects, rank 1 first."""
        return self.ranks.procs if self.ranks else []

    def dead_follower(self) -> str | None:
        """A line naming the first follower that has exited and why, if any (an idle leader
        would not notice through a collective)."""
        return self.ranks.dead() if self.ranks else None

    def __getattr__(self, name: str):
        return getattr(self.sched, name)

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams, *,
                    auto_max_tokens: bool = False) -> SamplingParams | None:
        """Rank 0 admits (so followers never refuse) and the followers get the parameters it
        admitted with: the same `max_tokens` on every rank."""
        admitted = self.sched.add_request(uid, input_ids, params, auto_max_tokens=auto_max_tokens)
        if admitted is not None:
            self._pending.append(["add", uid, list(input_ids), dataclasses.asdict(admitted)])
        return admitted

    def abort(self, uid: int) -> bool:
        """NOTE: only an abort that dropped a live request is broadcast; one that overtook its
        request is remembered by rank 0 alone, which then never broadcasts that request."""
        dropped = self.sched.abort(uid)
        if dropped:
            self._pending.append(["abort", uid])
        return dropped

    def step(self) -> list[TokenOutput]:
        if (dead := self.dead_follower()) is not None:
            raise RuntimeError(dead)
        try:
            if ready := self.sched.ready_grammars():
                failed = self.sched.admit_grammars(ready)
                self._pending.append(["grammar", [u for u in ready if u not in failed], failed])
            get_comm().broadcast_bytes(_encode(self._pending))
            self._pending = []
            return self.sched.step()
        except Exception as e:  # a collective failed: name the rank that caused it, if one died
            if (dead := self.dead_follower()) is not None:
                raise RuntimeError(dead) from e
            raise

    def close(self, grace_s: float = 30.0) -> None:
        """Leave the group with the followers, in the same order on every rank: `exit` is
        broadcast, then every rank leaves the group at once (NCCL's destroy waits on its
        peers). If a follower is already gone, the communicators are aborted instead. Then the
        followers are reaped and the rendezvous removed. Idempotent; always returns."""
        from radixserve.distributed.torch_comm import shutdown_tp
        from radixserve.scheduler.rendezvous import remove_rendezvous

        if self._closed:
            return
        self._closed = True
        if self.ranks is not None:
            self.ranks.stop_watching()
        healthy = self.dead_follower() is None
        if healthy:
            try:
                get_comm().broadcast_bytes(_encode([["exit"]]))
            except Exception as e:  # noqa: BLE001 -- a follower died meanwhile: abort below
                logger.warning("tensor-parallel shutdown: the exit broadcast failed: %s", e)
                healthy = False
        if healthy:  # (a peer gone: a kernel may wait on it; aborting is what ends it)
            release_cuda_graphs(self.sched)
        shutdown_tp(abort=not healthy)
        if self.ranks is not None:
            self.ranks.reap(grace_s)
        if self.init_method is not None:
            remove_rendezvous(self.init_method)


def follower_loop(sched: Scheduler) -> None:
    """Ranks 1..N-1: wait for the leader's commands, apply, step; until told to exit. A failed
    exchange with the leader raises `LeaderLost`."""
    sched.auto_admit_grammars = False  # the leader's `grammar` commands admit
    while True:
        try:
            # (logit_bias maps int token ids)
            cmds = msgpack.unpackb(get_comm().broadcast_bytes(None), strict_map_key=False)
        except RuntimeError as e:
            raise LeaderLost(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
        if not _apply(sched, cmds):
            break
        sched.step()
        sched.take_failures()  # rank 0 reports them
    logger.info("TP follower exiting")
