"""The scheduler *process*: started by the server, it opens the scheduler loop it is handed
(`scheduler/loop.py`: the scheduler behind the server's sockets, rank 0 of a group at TP > 1),
says it is ready, then serves until SIGTERM or until the server is gone, with a liveness heartbeat
from a thread of its own. It leaves between two steps, so a TP group leaves together, and exits
the moment it is done: the interpreter's teardown of a process that imported torch takes seconds
that a stopping server would otherwise wait for."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from radixserve.logs import setup_logging
from radixserve.messages import IpcAddresses
from radixserve.ranks.heartbeat import HeartbeatThread
from radixserve.utils.stack_dump import enable_stack_dumps

if TYPE_CHECKING:
    from radixserve.config import EngineConfig, SchedulerConfig

logger = logging.getLogger("radixserve.scheduler")
_IDLE_POLL_MS = 100
_STOP = threading.Event()  # set by SIGTERM once serving


class ServedLoop(Protocol):
    """What the process drives (`scheduler.loop.SchedulerLoop`)."""

    @property
    def has_work(self) -> bool: ...
    def receive(self, block_ms: int) -> list[Any]: ...
    def handle(self, msg: Any) -> None: ...
    def step(self) -> None: ...
    def tick(self, busy: bool) -> None: ...
    def ready_info(self) -> dict[str, int]: ...
    def dead_follower(self) -> str | None: ...
    def close(self) -> None: ...


OpenLoop = Callable[["EngineConfig", "SchedulerConfig", zmq.Context, IpcAddresses], ServedLoop]


def serve_forever(loop: ServedLoop, heartbeat: HeartbeatThread, parent_pid: int) -> None:
    """Receive, apply, step, until SIGTERM (between two steps) or the parent's death."""
    while os.getppid() == parent_pid:
        if _STOP.is_set():
            return
        heartbeat.beat()
        if (dead := loop.dead_follower()) is not None:
            logger.error("scheduler: %s; exiting", dead)
            sys.exit(1)
        busy = loop.has_work
        for msg in loop.receive(0 if busy else _IDLE_POLL_MS):
            loop.handle(msg)
        if loop.has_work:
            loop.step()
        loop.tick(loop.has_work)
    logger.error("scheduler: the server process is gone; exiting")


def run_scheduler_process(engine: EngineConfig, sched: SchedulerConfig, addrs: IpcAddresses,
                          ack_queue, parent_pid: int, open_loop: OpenLoop) -> None:
    """Entry point of the spawned scheduler process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process coordinates shutdown
    signal.signal(signal.SIGTERM, _exit_now)  # while starting: unwind, so a TP group is stopped
    setup_logging("scheduler")
    enable_stack_dumps("scheduler")
    import torch

    code = 0
    ctx = zmq.Context()
    try:
        with torch.inference_mode():
            loop = open_loop(engine, sched, ctx, addrs)
            try:
                signal.signal(signal.SIGTERM, lambda *_: _STOP.set())  # serving: between steps
                ack_queue.put(("scheduler", loop.ready_info()))
                serve_forever(loop, HeartbeatThread(ctx, addrs).start(), parent_pid)
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the teardown itself is bounded
                loop.close()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        logger.exception("scheduler: failed")
        code = 1
    ack_queue.close()
    ack_queue.join_thread()  # the ready message is out before the process goes
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_now(*_) -> None:
    raise SystemExit(143)
