"""The scheduler behind the server's sockets: a thin adapter. Messages in from the tokenizers, the
detokenizer and the API; `scheduler/lifecycle.py` applies them to the scheduler (which owns every
decision about a request); messages out to the detokenizer, and the scheduler's gauges to the API.
At TP > 1 the scheduler is rank 0's `TPLeader` (`scheduler/tp.py`), which publishes what it
applies to the other ranks; this loop does not change. The process around it is
`ranks/process.py`'s."""
from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.messages import (
    AbortMsg,
    IpcAddresses,
    LoadLoRA,
    SchedulerStats,
    TokenBatch,
    UnloadLoRA,
    UserMsg,
    make_socket,
    recv_nowait,
    send,
)
from radixserve.scheduler import lifecycle

logger = logging.getLogger("radixserve.scheduler")
_STATS_EVERY_S = 0.25


class SchedulerLoop:
    def __init__(self, scheduler, ctx: zmq.Context, addrs: IpcAddresses) -> None:
        """`scheduler`: a `Scheduler`, or a `TPLeader` (the same interface)."""
        self.scheduler, self.ctx, self.addrs = scheduler, ctx, addrs
        self.inbox = make_socket(ctx, zmq.PULL, addrs.scheduler, bind=True)
        self.poller = zmq.Poller()
        self.poller.register(self.inbox, zmq.POLLIN)
        self.to_detok = make_socket(ctx, zmq.PUSH, addrs.detokenizer, bind=False)
        self.to_api = make_socket(ctx, zmq.PUSH, addrs.frontend, bind=False)
        self.last_stats = 0.0
        self.integrity_ok: bool | None = None

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def receive(self, block_ms: int) -> list[Any]:
        """What arrived, waiting up to `block_ms` for the first message."""
        if block_ms and not self.poller.poll(block_ms):
            return []
        return recv_nowait(self.inbox)

    def handle(self, msg: Any) -> None:
        if isinstance(msg, UserMsg):
            out = lifecycle.admit(self.scheduler, msg)
        elif isinstance(msg, AbortMsg):
            out = lifecycle.abort(self.scheduler, msg.uid)
        elif isinstance(msg, (LoadLoRA, UnloadLoRA)):  # answered to the API, which asked
            send(self.to_api, lifecycle.change_lora(self.scheduler, msg))
            return
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

    def tick(self, busy: bool) -> None:
        """A few times a second: the gauges to the API, and while idle the KV/radix integrity
        check (once per idle spell)."""
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
        send(self.to_api, SchedulerStats(stats, self.integrity_ok, self.scheduler.lora_requests()))

    def ready_info(self) -> dict[str, int]:
        """What the server learns once the scheduler is up (its context, its KV capacity)."""
        kv = self.scheduler.stats()
        return {"max_seq_len": int(self.scheduler.max_seq_len),
                "kv_tokens_total": int(kv["kv_tokens_total"]),
                "kv_pages_total": int(kv["kv_pages_total"])}

    def dead_follower(self) -> str | None:
        return getattr(self.scheduler, "dead_follower", lambda: None)()

    def close(self) -> None:
        """At TP > 1, leave the group with the followers."""
        close = getattr(self.scheduler, "close", None)
        if close is not None:
            close(grace_s=3.0)


def open_loop(engine: EngineConfig, sched: SchedulerConfig, ctx: zmq.Context,
              addrs: IpcAddresses) -> SchedulerLoop:
    """The scheduler process's loop: one `Scheduler`, or at TP > 1 rank 0 of a new group."""
    if engine.tp > 1:
        from radixserve.scheduler.tp import start_leader

        scheduler = start_leader(engine, sched)
    else:
        from radixserve.scheduler.scheduler import Scheduler

        scheduler = Scheduler(engine, sched)
    try:
        return SchedulerLoop(scheduler, ctx, addrs)
    except BaseException:
        getattr(scheduler, "close", lambda **_: None)(grace_s=3.0)
        raise
