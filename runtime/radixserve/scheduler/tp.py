"""Tensor parallelism for the scheduler: every rank runs an identical `Scheduler` over its shard.
Rank 0 takes requests; before each step it broadcasts the commands it accepted since the last one
(msgpack over the gloo control group: a collective, so nothing is dropped however late a rank
joins), and every rank applies them and steps in lockstep. Logits are all-gathered, so every rank
samples the same tokens; only rank 0 reports them."""
from __future__ import annotations

import dataclasses
import logging

import msgpack

from radixserve.distributed import get_comm
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.output import TokenOutput
from radixserve.scheduler.scheduler import Scheduler

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
        elif cmd[0] == "exit":
            return False
    return True


class TPLeader:
    """Rank 0's face: the `Scheduler` interface, plus the broadcast to the followers."""

    def __init__(self, sched: Scheduler, followers: list | None = None) -> None:
        self.sched = sched
        self.followers = followers or []  # multiprocessing.Process of ranks 1..N-1
        self._pending: list[list] = []

    def dead_follower(self) -> str | None:
        """A line naming the first follower that has died, if any (the leader may be idle and
        would not notice through a collective)."""
        for rank, p in enumerate(self.followers, start=1):
            if not p.is_alive():
                return f"tensor-parallel rank {rank} (pid {p.pid}) died with exit code {p.exitcode}"
        return None

    def __getattr__(self, name: str):
        return getattr(self.sched, name)

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams) -> None:
        self.sched.add_request(uid, input_ids, params)  # validates first: followers never fail
        self._pending.append(["add", uid, list(input_ids), dataclasses.asdict(params)])

    def abort(self, uid: int) -> None:
        self.sched.abort(uid)
        self._pending.append(["abort", uid])

    def step(self) -> list[TokenOutput]:
        get_comm().broadcast_bytes(_encode(self._pending))
        self._pending = []
        return self.sched.step()

    def shutdown(self) -> None:
        get_comm().broadcast_bytes(_encode([["exit"]]))


def follower_loop(sched: Scheduler) -> None:
    """Ranks 1..N-1: wait for the leader's commands, apply, step; until told to exit."""
    while _apply(sched, msgpack.unpackb(get_comm().broadcast_bytes(None))):
        sched.step()
    logger.info("TP follower exiting")
