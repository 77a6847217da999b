"""Tensor parallelism for the scheduler: every rank runs an identical `Scheduler` over its shard
and applies the same typed messages in the same order. Rank 0 (`TPLeader`) takes the requests
(`UserMsg`) and aborts (`AbortMsg`) as they come and, before each step, publishes them to the
other ranks with its decision of which grammar-constrained requests to queue (`GrammarsReady`:
each rank compiles on its own threads, so "compiled yet?" would differ between ranks); a follower
(`follow`) applies each one through `lifecycle` as rank 0 did, then steps. So every rank holds the
same requests and steps in lockstep; logits are all-gathered, every rank samples the same tokens,
and only rank 0 reports them. The processes themselves are `ranks/`'s."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.core.output import TokenOutput
from radixserve.messages import AbortMsg, GrammarsReady, LeaveGroup, LoadLoRA, UnloadLoRA, UserMsg
from radixserve.models.source import ModelSource
from radixserve.ranks import channel
from radixserve.ranks.group import RankGroup, start_group
from radixserve.ranks.shape import validate_tp
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler import lifecycle
from radixserve.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


def build_rank(eng: EngineConfig, sched: SchedulerConfig, source: ModelSource | None = None) -> Scheduler:
    """A rank's scheduler, once the rank has joined the group; rank 0's admits grammars only when
    it decides to (`TPLeader.step`), a follower's when told."""
    rank = Scheduler(eng, sched, source)
    rank.auto_admit_grammars = False
    return rank


def follow(sched: Scheduler) -> None:
    """Ranks 1..N-1: apply what rank 0 published, step; until told to leave. A failed exchange
    with rank 0 raises `channel.LeaderLost`."""
    while True:
        msgs = channel.receive()
        if any(isinstance(m, LeaveGroup) for m in msgs):
            break
        for msg in msgs:
            lifecycle.apply(sched, msg)
        sched.step()
        sched.take_failures()  # rank 0 reports them
    logger.info("TP follower leaving")


class TPLeader:
    """Rank 0's face: the `Scheduler` interface, whose request-changing calls are published to the
    followers as the typed messages they came as, plus the group's teardown (`close`)."""

    def __init__(self, sched: Scheduler, group: RankGroup | None = None) -> None:
        self.sched, self.group = sched, group
        self._pending: list[UserMsg | AbortMsg | GrammarsReady | LoadLoRA | UnloadLoRA] = []

    @property
    def followers(self) -> list:
        """The followers' `multiprocessing.Process` objects, rank 1 first."""
        return self.group.ranks.procs if self.group else []

    def dead_follower(self) -> str | None:
        """A line naming the first follower that has exited and why, if any (an idle leader
        would not notice through a collective)."""
        return self.group.dead() if self.group else None

    def __getattr__(self, name: str):
        return getattr(self.sched, name)

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams, *,
                    auto_max_tokens: bool = False, lora: str | None = None) -> SamplingParams | None:
        """Admitted here and on every follower alike: each applies the same admission to the
        same message, so all agree on the outcome and the `max_tokens` filled in."""
        self._pending.append(UserMsg(uid, list(input_ids), params, auto_max_tokens, lora))
        return self.sched.add_request(uid, input_ids, params, auto_max_tokens=auto_max_tokens,
                                      lora=lora)

    def load_lora(self, name: str, path: str) -> None:
        """Loaded here first (checked before anything is loaded), then on every follower."""
        self.sched.load_lora(name, path)
        self._pending.append(LoadLoRA(0, name, path))

    def unload_lora(self, name: str) -> None:
        self.sched.unload_lora(name)
        self._pending.append(UnloadLoRA(0, name))

    def abort(self, uid: int) -> bool:
        self._pending.append(AbortMsg(uid))
        return self.sched.abort(uid)

    def step(self) -> list[TokenOutput]:
        if (dead := self.dead_follower()) is not None:
            raise RuntimeError(dead)
        try:
            if ready := self.sched.ready_grammars():
                failed = self.sched.admit_grammars(ready)
                self._pending.append(GrammarsReady([u for u in ready if u not in failed], failed))
            channel.publish(self._pending)
            self._pending = []
            return self.sched.step()
        except Exception as e:  # a collective failed: name the rank that caused it, if one died
            if (dead := self.dead_follower()) is not None:
                raise RuntimeError(dead) from e
            raise

    def close(self, grace_s: float = 30.0) -> None:
        """Leave the group with the followers (`RankGroup.close`); idempotent, always returns."""
        if self.group is not None:
            self.group.close(lambda: channel.publish([LeaveGroup()]),
                             self.sched.engine.release_cuda_graphs, grace_s)


def start_leader(eng: EngineConfig, sched: SchedulerConfig) -> TPLeader:
    """Ranks 1..tp-1 spawned and rank 0 here, as a `TPLeader` whose `close()` ends the group;
    `--tp` is checked against the model before any process starts."""
    source = ModelSource.resolve(eng.model)
    validate_tp(eng.tp, source.config)
    sched0, group = start_group(eng, sched, source, build_rank, follow)
    leader = TPLeader(sched0, group)
    logger.info("tensor-parallel group of %d formed (followers: pids %s)", eng.tp,
                ", ".join(str(p.pid) for p in leader.followers))
    return leader


@contextlib.contextmanager
def scheduler_group(eng: EngineConfig, sched: SchedulerConfig) -> Iterator:
    """A scheduler for `eng.tp` ranks, torn down on exit: in this process at TP=1; else followers
    spawned on GPUs 1..N-1 and the leader (`TPLeader`, the `Scheduler` interface) here."""
    if eng.tp == 1:
        yield Scheduler(eng, sched)
        return
    leader = start_leader(eng, sched)
    try:
        yield leader
    finally:
        leader.close()
