"""One access line per HTTP request, and the request id.

The outermost ASGI layer: it takes the client's `X-Request-Id` (or makes one), echoes it on the
response, and sets it in `radixserve.logs.request_id` so every line logged while serving the
request carries it. When the response has ended it logs method, path, status, prompt and
completion tokens, time to first token and duration; a rejected request (4xx) is a WARNING line
with the error's message and param, a 5xx an ERROR line. Health and metrics probes log at DEBUG.
A request whose client left before its response ended is logged as 499 (client closed), whatever
the handler answered.
"""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixserve.logs import request_id
from radixserve.messages import UserReply

logger = logging.getLogger("radixserve.access")
_VALID_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")  # NOTE: never a newline or a quote in a log line
_PROBES = frozenset({"/health", "/metrics"})
_ERROR_BODY_LIMIT = 8192
CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before the response ended


@dataclass
class AccessRecord:
    """What the handlers learn about a request, for its access line: the tokens as far as its
    replies went, also when they stopped early (the client left, the drain deadline passed)."""

    t0: float
    ttft_s: float | None = None
    # per sub-request uid: (prompt tokens, if its prompt is not also another's; tokens generated)
    counts: dict[int, tuple[int, int]] = field(default_factory=dict)
    # per sub-request uid, under speculative decoding: (drafts kept, tokens drafted)
    drafts: dict[int, tuple[int, int]] = field(default_factory=dict)

    def on_reply(self, r: UserReply, counts_prompt: bool) -> None:
        """`counts_prompt`: this sub-request's prompt is not also another's (n > 1 shares one)."""
        if r.token_ids and self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.t0
        # every reply carries the counts so far; an abort's reply carries none
        prompt, completion = self.counts.get(r.uid, (0, 0))
        self.counts[r.uid] = (max(prompt, r.prompt_tokens if counts_prompt else 0),
                              max(completion, r.completion_tokens))
        if r.spec_drafted:
            kept, drafted = self.drafts.get(r.uid, (0, 0))
            self.drafts[r.uid] = (max(kept, r.spec_accepted), max(drafted, r.spec_drafted))

    @property
    def prompt_tokens(self) -> int:
        return sum(p for p, _ in self.counts.values())

    @property
    def completion_tokens(self) -> int:
        return sum(c for _, c in self.counts.values())


current_access: ContextVar[AccessRecord | None] = ContextVar("radixserve_access", default=None)


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's `X-Request-Id` when it is a plain token of at most 128 characters; else a new one."""
    given = next((v for k, v in headers if k == b"x-request-id"), b"").decode("latin-1")
    return given if _VALID_ID.fullmatch(given) else uuid.uuid4().hex


def _error_of(body: bytes) -> dict:
    try:
        err = json.loads(body)["error"]
        return {"error": str(err["message"])} | ({"param": err["param"]} if err.get("param") else {})
    except (ValueError, KeyError, TypeError):
        return {}


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = request_id_from(scope["headers"])
        record = AccessRecord(time.perf_counter())
        rid_token, record_token = request_id.set(rid), current_access.set(record)
        status, error_body, complete, client_left = 0, b"", False, False

        async def receiving() -> Message:
            nonlocal client_left
            message = await receive()
            client_left = client_left or (message["type"] == "http.disconnect" and not complete)
            return message

        async def sending(message: Message) -> None:
            nonlocal status, error_body, complete
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            if message["type"] == "http.response.start":
                status = message["status"]
                message = message | {"headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            elif message["type"] == "http.response.body" and status >= 400 and len(error_body) < _ERROR_BODY_LIMIT:
                error_body += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            if client_left:  # whatever the handler answered, nobody read all of it
                status = CLIENT_CLOSED
            _log(scope, status, record, _error_of(error_body) if 400 <= status != CLIENT_CLOSED else {})
            request_id.reset(rid_token)
            current_access.reset(record_token)


def _log(scope: Scope, status: int, record: AccessRecord, error: dict) -> None:
    fields = {"method": scope.get("method", ""), "path": scope.get("path", ""), "status": status,
              "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
              "ttft_ms": None if record.ttft_s is None else round(record.ttft_s * 1000, 1),
              "duration_ms": round((time.perf_counter() - record.t0) * 1000, 1)} | error
    if record.drafts:  # speculative decoding: drafts kept / drafted
        kept, drafted = (sum(x) for x in zip(*record.drafts.values()))
        fields["accepted"] = f"{kept}/{drafted}"
    if status == CLIENT_CLOSED:
        level = logging.INFO
    elif status >= 500 or status == 0:  # 0: the app ended without a response (cancelled)
        level = logging.ERROR
    elif status >= 400:
        level = logging.WARNING
    else:
        level = logging.DEBUG if fields["path"] in _PROBES else logging.INFO
    head = {k: fields.pop(k) for k in ("method", "path", "status")}
    outcome = " client closed" if status == CLIENT_CLOSED else " rejected" if 400 <= status < 500 else ""
    message = f"{head['method']} {head['path']} {status}{outcome}"
    logger.log(level, message, extra={"fields": fields, "message_fields": head})
