"""The scheduler *process*: a ZMQ loop around the in-process `Scheduler`.

Rank 0 receives from the tokenizers, the detokenizer and the API (`_Rank0Inbox`). At TP > 1 the
scheduler object is the TP leader (`scheduler/tp_launch.py`), which broadcasts every add/abort/step
to ranks 1..N-1, spawned from this process; the loop itself does not change.
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import zmq

from radixserve.logs import setup_logging
from radixserve.messages import (
    AbortMsg,
    IpcAddresses,
    SchedulerStats,
    TokenBatch,
    UserMsg,
    make_socket,
    recv_nowait,
    send,
)
from radixserve.scheduler import lifecycle
from radixserve.scheduler.heartbeat import HeartbeatThread
from radixserve.utils.stack_dump import enable_stack_dumps

if TYPE_CHECKING:
    from radixserve.config import EngineConfig, SchedulerConfig

logger = logging.getLogger("radixserve.scheduler")
DEFAULT_SCHEDULER = "radixserve.scheduler.scheduler:Scheduler"
_IDLE_POLL_MS = 100
_STATS_EVERY_S = 0.25
_STOP = threading.Event()  # set by SIGTERM once serving


class _Rank0Inbox:
    def __init__(self, ctx: zmq.Context, addrs: IpcAddresses) -> None:
        self.sock = make_socket(ctx, zmq.PULL, addrs.scheduler, bind=True)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)

    def receive(self, block_ms: int) -> list[Any]:
        if block_ms and not self.poller.poll(block_ms):
            return []
        return recv_nowait(self.sock)


class SchedulerLoop:
    """A thin adapter: messages in, `scheduler/lifecycle.py` applies them to the scheduler (which
    owns every decision about a request), messages out to the detokenizer."""

    def __init__(self, scheduler, ctx: zmq.Context, addrs: IpcAddresses) -> None:
        self.scheduler, self.ctx, self.addrs = scheduler, ctx, addrs
        self.inbox = _Rank0Inbox(ctx, addrs)
        self.to_detok = make_socket(ctx, zmq.PUSH, addrs.detokenizer, bind=False)
        self.to_api = make_socket(ctx, zmq.PUSH, addrs.frontend, bind=False)
        self.last_stats = 0.0
        self.integrity_ok: bool | None = None

    def handle(self, msg: Any) -> None:
        if isinstance(msg, UserMsg):
            out = lifecycle.admit(self.scheduler, msg)
        elif isinstance(msg, AbortMsg):
            out = lifecycle.abort(self.scheduler, msg.uid)
        else:
            logger.error("scheduler: unexpected message %r", type(msg).__name__)
            return
        if out is not None:
            send(self.to_detok, out)

    def step(self) -> None:
        tokens, failed = lifecycle.step(self.scheduler)
        if tokens:
            send(self.to_detok, TokenBatch(tokens))
        for f in failed:
            send(self.to_detok, f)

    def _maybe_stats(self, busy: bool) -> None:
        now = time.monotonic()
        if now - self.last_stats < _STATS_EVERY_S:
            return
        self.last_stats = now
        if busy:
            self.integrity_ok = None
        elif self.integrity_ok is None:
            try:
                self.scheduler.check_integrity()
                self.integrity_ok = True
            except AssertionError as e:
                logger.error("scheduler: KV/radix integrity check failed: %s", e)
                self.integrity_ok = False
        stats = {k: int(v) for k, v in self.scheduler.stats().items()}
        send(self.to_api, SchedulerStats(stats, self.integrity_ok, time.time()))

    def run_forever(self, parent_pid: int) -> None:
        dead_follower = getattr(self.scheduler, "dead_follower", lambda: None)
        heartbeat = HeartbeatThread(self.ctx, self.addrs).start()
        while os.getppid() == parent_pid:
            if _STOP.is_set():  # SIGTERM: leave between steps, so a TP group can leave together
                return
            heartbeat.beat()
            if (dead := dead_follower()) is not None:
                logger.error("scheduler: %s; exiting", dead)
                sys.exit(1)
            busy = self.scheduler.has_work
            for msg in self.inbox.receive(0 if busy else _IDLE_POLL_MS):
                self.handle(msg)
            if self.scheduler.has_work:
                self.step()
            self._maybe_stats(self.scheduler.has_work)
        logger.error("scheduler: the server process is gone; exiting")


def load_scheduler_class(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def create_scheduler(engine: EngineConfig, sched: SchedulerConfig, scheduler_class: str):
    if engine.tp > 1:
        from radixserve.scheduler.tp_launch import start_group

        return start_group(engine, sched)  # closed by run_scheduler_process
    return load_scheduler_class(scheduler_class)(engine, sched)


def run_scheduler_process(
    engine: EngineConfig,
    sched: SchedulerConfig,
    addrs: IpcAddresses,
    ack_queue,
    parent_pid: int,
    scheduler_class: str = DEFAULT_SCHEDULER,
) -> None:
    """Entry point of the spawned scheduler process (TP = 1)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process coordinates shutdown
    signal.signal(signal.SIGTERM, _exit_now)  # while starting: unwind, so a TP group is stopped
    setup_logging("scheduler")
    enable_stack_dumps("scheduler")
    import torch

    with torch.inference_mode():
        scheduler = create_scheduler(engine, sched, scheduler_class)
        try:
            signal.signal(signal.SIGTERM, lambda *_: _STOP.set())  # serving: stop between steps
            ctx = zmq.Context()
            loop = SchedulerLoop(scheduler, ctx, addrs)
            kv = scheduler.stats()
            ack_queue.put(("scheduler", {"max_seq_len": int(scheduler.max_seq_len),
                                         "kv_tokens_total": int(kv["kv_tokens_total"]),
                                         "kv_pages_total": int(kv["kv_pages_total"])}))
            loop.run_forever(parent_pid)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the teardown itself is bounded
            if engine.tp > 1:  # the TP leader: leave the group with the followers
                scheduler.close(grace_s=3.0)


def _exit_now(*_) -> None:
    raise SystemExit(143)
