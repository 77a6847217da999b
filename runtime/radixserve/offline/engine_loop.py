"""One engine loop per `LLM`, shared by every caller: synchronous calls, iterators and asyncio
tasks, from any thread, batch together in the same scheduler.

Requests and aborts go into an inbox (never blocking the caller); a *turn* admits what arrived,
runs one scheduler step and hands each reply to its request's sink. A synchronous caller takes
turns on its own thread until its requests are done; asynchronous callers do not step: a
background thread takes turns while there is work, and exits when there is none. A lock makes
turns atomic, so whichever thread steps, every caller's requests advance together.

A step that raises leaves the scheduler in an unknown state: the engine is marked failed, every
waiting caller gets the error, and later calls raise it ("fail loudly, never hang")."""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable

from radixserve.messages import AbortMsg, LoadLoRA, RequestFailed, UnloadLoRA, UserMsg
from radixserve.offline.pipeline import LocalPipeline, Reply

logger = logging.getLogger(__name__)
Sink = Callable[[Reply | Exception], None]  # an Exception: the engine failed
_PUMP_IDLE_S = 0.05


class EngineLoop:
    def __init__(self, pipeline: LocalPipeline) -> None:
        self.pipeline = pipeline
        self._lock = threading.Lock()  # held for a whole turn
        self._inbox: deque[UserMsg | AbortMsg] = deque()
        self._sinks: dict[int, Sink] = {}
        self._uids = itertools.count()
        self._pump_lock = threading.Lock()  # guards starting and stopping the background thread
        self._pump: threading.Thread | None = None
        self._wake = threading.Event()
        self._closed = False
        self.failure: Exception | None = None

    def new_uid(self) -> int:
        return next(self._uids)

    def submit(self, msgs: list[UserMsg], sink: Sink, *, background: bool = False) -> None:
        """Queue requests; each reply (and a refusal, as RequestFailed) goes to `sink`, called on
        the thread that took the turn. `background`: the caller does not step (asyncio), so the
        background thread must."""
        self._check()
        for m in msgs:
            self._sinks[m.uid] = sink
        self._inbox.extend(msgs)
        self._wake.set()
        if background:
            self._ensure_pump()

    def abort(self, uids: Iterable[int]) -> None:
        """Drop requests in any state; their sinks get nothing more. Never blocks."""
        for uid in uids:
            self._sinks.pop(uid, None)
            self._inbox.append(AbortMsg(uid))
        self._wake.set()

    def change_lora(self, msg: LoadLoRA | UnloadLoRA) -> None:
        """Load or unload a LoRA adapter between two turns; ValueError if it cannot be done."""
        with self._lock:
            self._check()
            reply = self.pipeline.change_lora(msg)
        if reply.error is not None:
            raise ValueError(reply.error)

    def turn(self) -> bool:
        """Admit and abort what arrived, then one scheduler step; False if there was nothing
        to do."""
        with self._lock:
            self._check()
            replies: list[Reply] = []
            worked = bool(self._inbox)
            try:
                while self._inbox:
                    msg = self._inbox.popleft()
                    if isinstance(msg, UserMsg):
                        replies += self.pipeline.submit(msg)
                    else:
                        replies += self.pipeline.abort(msg.uid)
                if self.pipeline.scheduler.has_work:
                    worked = True
                    replies += self.pipeline.step()
            except Exception as e:
                self._fail(e)
                raise
            self._route(replies)
            return worked

    def run_until(self, done: Callable[[], bool]) -> None:
        """Take turns on this thread until `done()` (it turns true from a sink)."""
        while not done():
            if not self.turn() and not done():
                raise RuntimeError("internal error: requests are unanswered, but the engine has "
                                   "nothing left to do")

    def settle(self) -> None:
        """With no request left, finish what is still in flight (the overlap batch, deferred
        releases), so an idle engine holds nothing but its prefix cache."""
        while self.failure is None and not self._sinks and (
                self._inbox or self.pipeline.scheduler.has_work):
            self.turn()

    def close(self) -> None:
        """Stop the background thread; callers still waiting get an error. Idempotent."""
        with self._pump_lock:
            self._closed = True
            pump = self._pump
        self._wake.set()
        if pump is not None:
            pump.join()
        with self._lock:
            self._fail_sinks(RuntimeError("the LLM was closed"))

    def _check(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the engine failed earlier: {self.failure}") from self.failure
        if self._closed:
            raise RuntimeError("the LLM was closed")

    def _route(self, replies: list[Reply]) -> None:
        for r in replies:
            sink = self._sinks.get(r.uid)
            if sink is None:
                continue  # aborted by its caller
            if isinstance(r, RequestFailed) or r.finished:
                del self._sinks[r.uid]
            try:
                sink(r)
            except Exception:  # e.g. the caller's event loop is closed: nobody reads it any more
                logger.warning("LLM: could not deliver a reply of request %d; aborting it", r.uid,
                               exc_info=True)
                self.abort([r.uid])

    def _fail(self, e: Exception) -> None:
        logger.error("LLM: the engine failed: %s", e)
        self.failure = e
        self._fail_sinks(e)

    def _fail_sinks(self, e: Exception) -> None:
        sinks, self._sinks = self._sinks, {}
        for sink in set(sinks.values()):
            with contextlib.suppress(Exception):  # a closed event loop: nobody to tell
                sink(e)

    def _ensure_pump(self) -> None:
        with self._pump_lock:
            if self._pump is None and not self._closed:
                self._pump = threading.Thread(target=self._pump_main, name="radixserve-engine",
                                              daemon=True)
                self._pump.start()

    def _pump_main(self) -> None:
        import torch

        device = self.pipeline.scheduler.device
        if device.type == "cuda":  # NOTE: the current device is per thread
            torch.cuda.set_device(device)
        with torch.inference_mode():
            while True:
                try:
                    worked = self.turn()
                except Exception:  # noqa: BLE001 -- its callers were told (`_fail`)
                    worked = False
                if worked:
                    continue
                with self._pump_lock:  # NOTE: checked under the lock `submit` starts us with
                    if self._closed or self.failure is not None or not (
                            self._sinks or self._inbox):
                        self._pump = None
                        return
                self._wake.wait(_PUMP_IDLE_S)
                self._wake.clear()
