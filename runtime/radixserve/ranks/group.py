"""Start and stop a tensor-parallel group: ranks 1..N-1 in spawned processes (`processes.py`),
rank 0 in this one. What each rank runs is handed in by the scheduler (`scheduler/tp.py`): `build`
makes a rank's scheduler once the rank has joined, `follow` serves rank 0's messages on a
follower; both are module-level functions, so spawn passes them by name."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from radixserve import settings
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.models.source import ModelSource
from radixserve.ranks.channel import LeaderLost
from radixserve.ranks.processes import FAILED, JOINING, RankProcesses
from radixserve.ranks.rendezvous import new_rendezvous, remove_rendezvous

logger = logging.getLogger(__name__)
Build = Callable[..., Any]  # (EngineConfig, SchedulerConfig[, ModelSource]) -> a rank's scheduler


def rank_device(spec: str, rank: int) -> str:
    import torch

    if spec in ("auto", "cuda") and torch.cuda.is_available():
        if torch.cuda.device_count() <= rank:
            raise ValueError(f"tensor parallel rank {rank} needs GPU {rank}, but only "
                             f"{torch.cuda.device_count()} are visible")
        return f"cuda:{rank}"
    return "cpu" if spec == "auto" else spec


def join_rank(rank: int, eng: EngineConfig, init_method: str) -> EngineConfig:
    import torch

    from radixserve.distributed.torch_comm import init_tp
    from radixserve.utils.stack_dump import enable_stack_dumps

    enable_stack_dumps(f"tp{rank}")
    eng = dataclasses.replace(eng, device=rank_device(eng.device, rank))
    init_tp(rank, eng.tp, init_method, torch.device(eng.device))
    return eng


def _exit_when_orphaned(rank: int, leader_pid: int) -> None:
    """A follower outlives its leader only by a killed leader: leave instead of waiting in a
    collective (NCCL would wait for the group's timeout)."""
    def run() -> None:
        while os.getppid() == leader_pid:
            time.sleep(0.2)
        logging.getLogger(__name__).error("tensor-parallel rank %d: the leader (pid %d) is gone; "
                                          "exiting", rank, leader_pid)
        os._exit(1)

    threading.Thread(target=run, name="orphan-watch", daemon=True).start()


def follower_main(rank: int, eng: EngineConfig, sched: SchedulerConfig, init_method: str,
                  build: Build, follow: Callable[[Any], None], pipe) -> None:
    """A follower rank's process: tell rank 0 it is joining, join, serve rank 0's messages
    (`follow`), leave the group with the others; a start that fails is reported to rank 0
    through `pipe`. It exits at once when done: the interpreter's own teardown of a process
    that imported torch takes seconds, which nothing needs."""
    from radixserve.distributed.torch_comm import shutdown_tp
    from radixserve.logs import setup_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; rank 0 decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 0 ends the group; its death ends this rank
    setup_logging(f"tp{rank}")
    log = logging.getLogger(__name__)
    _exit_when_orphaned(rank, os.getppid())
    try:
        time.sleep(settings.TP_FOLLOWER_DELAY_S.get())  # tests: a late rank
        if settings.TP_FOLLOWER_FAIL.is_set():  # tests: a rank whose start fails
            raise RuntimeError(settings.TP_FOLLOWER_FAIL.get())
        pipe.send_bytes(JOINING)
        sched_r = build(join_rank(rank, eng, init_method), sched)
    except BaseException as e:
        with contextlib.suppress(OSError):
            pipe.send_bytes(FAILED + f"{type(e).__name__}: {e}".encode())
        raise
    log.info("tensor-parallel rank %d ready (pid %d)", rank, os.getpid())
    try:
        follow(sched_r)
    except LeaderLost as e:  # the leader died mid-exchange: one line, not a traceback
        log.error("tensor-parallel rank %d: lost the leader (%s); exiting", rank, e)
        sys.exit(1)
    sched_r.engine.release_cuda_graphs()
    shutdown_tp()
    log.info("tensor-parallel rank %d left the group", rank)
    logging.shutdown()
    os._exit(0)


@dataclasses.dataclass
class RankGroup:
    """A formed group, seen from rank 0: the followers' processes and the rendezvous."""

    ranks: RankProcesses
    init_method: str
    closed: bool = False

    def dead(self) -> str | None:
        """A line naming the first follower that has exited and why, if any."""
        return self.ranks.dead()

    def close(self, say_leave: Callable[[], None], release: Callable[[], None],
              grace_s: float) -> None:
        """Leave the group with the followers, in the same order on every rank: `say_leave`
        tells them (a collective), `release` drops what holds the communicators, then every
        rank leaves the group at once (NCCL's destroy waits on its peers). If a follower is
        already gone, the communicators are aborted instead. Then the followers are reaped
        and the rendezvous removed. Idempotent; always returns."""
        from radixserve.distributed.torch_comm import shutdown_tp

        if self.closed:
            return
        self.closed = True
        self.ranks.stop_watching()
        healthy = self.dead() is None
        if healthy:
            try:
                say_leave()
            except Exception as e:  # noqa: BLE001 -- a follower died meanwhile: abort below
                logger.warning("tensor-parallel shutdown: telling the ranks to leave failed: %s", e)
                healthy = False
        if healthy:  # (a peer gone: a kernel may wait on it; aborting is what ends it)
            release()
        shutdown_tp(abort=not healthy)
        self.ranks.reap(grace_s)
        remove_rendezvous(self.init_method)


def start_group(eng: EngineConfig, sched: SchedulerConfig, source: ModelSource, build: Build,
                follow: Callable[[Any], None]) -> tuple[Any, RankGroup]:
    """Spawn ranks 1..tp-1 and build rank 0's scheduler here (on `source`, the model this process
    resolved; each follower resolves its directory once more in its own process); returns it and
    the group. A rank that dies or fails while starting raises `RuntimeError` naming it, as does a
    group that does not form within the init timeout; the other ranks are stopped and the
    rendezvous removed before the error propagates."""
    from radixserve.distributed.torch_comm import abort_tp, init_timeout_s, shutdown_tp

    eng, init_method = dataclasses.replace(eng, model=str(source.path)), new_rendezvous()
    limit = init_timeout_s()
    ranks = RankProcesses(follower_main, lambda r: (r, eng, sched, init_method, build, follow), eng.tp)
    try:
        ranks.wait_joining(limit)
        ranks.watch(lambda line: (logger.error("%s", line), abort_tp()))
        try:
            sched0 = build(join_rank(0, eng, init_method), sched, source)
        except Exception as e:
            if (dead := ranks.dead()) is not None:
                raise RuntimeError(f"{dead} while starting; the group cannot form") from e
            raise
        return sched0, RankGroup(ranks, init_method)
    except BaseException:
        shutdown_tp(abort=True, timeout_s=5)
        ranks.reap(grace_s=0)  # nothing to tell them: the group never formed
        remove_rendezvous(init_method)
        raise
