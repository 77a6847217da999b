"""The API process's side of the pipeline: sends prompts to the tokenizers, aborts to the scheduler,
and routes replies from the detokenizer to the waiting HTTP handlers."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import zmq
import zmq.asyncio

from radixserve.messages import (
    AbortMsg,
    Heartbeat,
    IpcAddresses,
    LoadLoRA,
    LoRAReply,
    RequestFailed,
    SchedulerStats,
    TextOpMsg,
    TextOpReply,
    TokenizeMsg,
    UnloadLoRA,
    UserReply,
    decode,
    encode,
    make_socket,
)
from radixserve.server.errors import APIError
from radixserve.server.metrics import ServerMetrics
from radixserve.server.prompt_bound import PromptBound

logger = logging.getLogger("radixserve.server")
_LIVENESS_S = 1.0


class RequestStream:
    """Replies of one HTTP request (n sub-requests, one uid each). `close()` aborts what is left."""

    def __init__(self, frontend: Frontend, uids: list[int]) -> None:
        self.frontend, self.uids = frontend, uids
        self.pending = set(uids)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.t0 = time.perf_counter()
        self.last_token_at: dict[int, float] = {}
        self.ttft_s: dict[int, float] = {}

    async def next(self) -> UserReply:
        """The next reply; APIError for a request the pipeline rejected or a dead server."""
        msg = await self.frontend.next_reply(self.queue)
        if isinstance(msg, RequestFailed):
            self.pending.discard(msg.uid)
            self.frontend.metrics.on_finished("error", 0, 0)
            raise APIError(msg.status, msg.message, msg.param, msg.code)
        self._observe(msg)
        if msg.finished:
            self.pending.discard(msg.uid)
            self.frontend.metrics.on_latency(time.perf_counter() - self.t0, self.ttft_s.get(msg.uid), msg.completion_tokens)
            self.frontend.metrics.on_finished(msg.finish_reason or "stop", msg.prompt_tokens, msg.completion_tokens)
        return msg

    def _observe(self, msg: UserReply) -> None:
        if not msg.token_ids:
            return
        now = time.perf_counter()
        last = self.last_token_at.get(msg.uid)
        if last is None:
            self.ttft_s[msg.uid] = now - self.t0
            self.frontend.metrics.ttft.observe(now - self.t0)
        else:
            self.frontend.metrics.itl.observe((now - last) / len(msg.token_ids))
        self.last_token_at[msg.uid] = now

    @property
    def done(self) -> bool:
        return not self.pending

    def close(self) -> None:
        """Synchronous on purpose: it runs in `finally` of a handler cancelled by a disconnect."""
        for uid in self.uids:
            self.frontend.routes.pop(uid, None)
        for uid in self.pending:
            self.frontend.metrics.on_finished("abort", 0, 0)
            self.frontend.abort(uid)
        self.pending.clear()


class Frontend:
    def __init__(self, addrs: IpcAddresses, metrics: ServerMetrics) -> None:
        self.addrs, self.metrics = addrs, metrics
        self.routes: dict[int, asyncio.Queue] = {}
        self.uids = itertools.count(1)
        # NOTE: counted from now, not from 0: every child acknowledged before the frontend exists,
        # so a probe in the first moment is not "no heartbeat for an hour"
        self.last_heartbeat = time.monotonic()
        self.step_age = 0.0  # seconds the scheduler's current loop iteration has run, per its heartbeat
        self.failure: str | None = None
        self.drain_deadline: float | None = None  # monotonic; set when a graceful shutdown starts
        self.prompt_bound: PromptBound | None = None  # set once the children report the context

    def start(self) -> None:
        """Bind the sockets and start routing; call inside the server's event loop."""
        ctx = zmq.asyncio.Context()
        self.to_tokenizer = make_socket(ctx, zmq.PUSH, self.addrs.tokenizer, bind=True)
        self.to_scheduler = make_socket(zmq.Context.instance(), zmq.PUSH, self.addrs.scheduler, bind=False)
        self.inbox = make_socket(ctx, zmq.PULL, self.addrs.frontend, bind=True)
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            msg: Any = decode(await self.inbox.recv())
            for item in msg if isinstance(msg, list) else [msg]:
                if isinstance(item, Heartbeat):
                    self.last_heartbeat, self.step_age = time.monotonic(), item.step_age
                elif isinstance(item, SchedulerStats):
                    self.last_heartbeat = time.monotonic()
                    self.metrics.on_stats(item)
                elif (queue := self.routes.get(item.uid)) is not None:
                    queue.put_nowait(item)

    async def submit(self, msgs: list[TokenizeMsg]) -> RequestStream:
        if self.failure:
            raise APIError(503, f"the server is failing: {self.failure}")
        if self.prompt_bound is not None:  # before any tokenizing: a 40 MB prompt costs minutes
            for m in msgs:
                self.prompt_bound.check(m.text, m.chat, m.input_ids, m.tools, m.template_kwargs,
                                        m.params.truncate_prompt_tokens)
        try:  # all or nothing: no sub-request is queued unless every one can be sent
            frames = [encode(m) for m in msgs]
        except (OverflowError, TypeError, ValueError) as e:
            raise APIError(400, f"the request cannot be encoded: {type(e).__name__}") from None
        stream = RequestStream(self, [m.uid for m in msgs])
        for m in msgs:
            self.routes[m.uid] = stream.queue
        try:
            for frame in frames:
                await self.to_tokenizer.send(frame)
        except BaseException:
            stream.close()  # aborts what was sent: a cancelled submit leaves nothing behind
            raise
        return stream

    async def text_op(self, msg: TextOpMsg) -> TextOpReply:
        """`/tokenize` or `/detokenize` through a tokenizer process; APIError if it cannot answer."""
        if self.failure:
            raise APIError(503, f"the server is failing: {self.failure}")
        if self.prompt_bound is not None and msg.op == "tokenize":
            self.prompt_bound.check(msg.text, msg.chat, template_kwargs=msg.template_kwargs)
        queue: asyncio.Queue = asyncio.Queue()
        self.routes[msg.uid] = queue
        try:
            await self.to_tokenizer.send(encode(msg))
            reply = await self.next_reply(queue)
        finally:
            self.routes.pop(msg.uid, None)
        if isinstance(reply, RequestFailed):  # the server failed meanwhile (`fail`)
            raise APIError(reply.status, reply.message)
        if reply.error is not None:
            raise APIError(400 if reply.param else 500, reply.error, reply.param)
        return reply

    async def change_lora(self, msg: LoadLoRA | UnloadLoRA) -> LoRAReply:
        """Ask the scheduler to load or unload an adapter and wait for its answer; APIError 503
        if the server fails meanwhile."""
        if self.failure:
            raise APIError(503, f"the server is failing: {self.failure}")
        queue: asyncio.Queue = asyncio.Queue()
        self.routes[msg.uid] = queue
        try:
            self.to_scheduler.send(encode(msg))
            reply = await self.next_reply(queue)
        finally:
            self.routes.pop(msg.uid, None)
        if isinstance(reply, RequestFailed):
            raise APIError(reply.status, reply.message)
        return reply

    async def next_reply(self, queue: asyncio.Queue) -> Any:
        """The next message routed to `queue`; APIError 503 once the server is failing or past
        its drain deadline (checked while waiting)."""
        while True:
            try:
                return await asyncio.wait_for(queue.get(), self.wait_limit())
            except asyncio.TimeoutError:
                if self.failure:
                    raise APIError(503, f"the server is failing: {self.failure}") from None
                if self.past_drain_deadline():
                    raise APIError(503, "the server is shutting down and its drain deadline has passed") from None

    def new_uid(self) -> int:
        return next(self.uids)

    def abort(self, uid: int) -> None:
        try:
            self.to_scheduler.send(encode(AbortMsg(uid)), zmq.NOBLOCK)
        except zmq.Again:
            logger.error("could not send the abort of request %d: the scheduler is not reading", uid)

    def fail(self, reason: str) -> None:
        self.failure = reason
        for uid, queue in list(self.routes.items()):
            queue.put_nowait(RequestFailed(uid, f"the server is failing: {reason}", status=503))

    def wait_limit(self) -> float:
        if self.drain_deadline is None:
            return _LIVENESS_S
        return max(0.0, min(_LIVENESS_S, self.drain_deadline - time.monotonic()))

    def past_drain_deadline(self) -> bool:
        return self.drain_deadline is not None and time.monotonic() >= self.drain_deadline

    def heartbeat_age(self) -> float:
        return time.monotonic() - self.last_heartbeat
