"""The request body, read and judged before any handler runs (inside the API-key check):

- larger than `max_bytes`: 413, from `Content-Length` before a byte is read, else as soon as the
  bytes received pass the limit (a chunked body has no length);
- no byte of it for `idle_s` while it is still coming, or, once it has taken `idle_s`, arriving
  slower than `MIN_BODY_RATE` on average: 408 (a client trickling a body, a byte every few
  seconds, holds a connection and a slot of `--max-connections` as long as it likes otherwise);
- JSON nested deeper than `MAX_JSON_DEPTH`, holding text that is not valid Unicode (in any string
  value or dictionary key) or too large in its parts (`json_checks.py`: keys in one object, items
  in one list, all of them together): 400 naming where (one validator for every route, so no
  handler can meet a lone surrogate or a RecursionError after work has started, and no later step
  spends a minute on a million keys).

A body that passes is handed to the application as it arrived; what comes after it on `receive`
(the client's disconnect) is passed through."""
from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixserve.json_checks import MAX_JSON_DEPTH, find_problem
from radixserve.server import json_body
from radixserve.server.middleware import send_error

MIN_BODY_RATE = 512  # bytes a second, on average, of a body past its first `idle_s` (Apache's MinRate)


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    """As FastAPI decides to parse a body as JSON: no content type, or `…/json` or `…+json`."""
    ctype = next((v for k, v in headers if k == b"content-type"), None)
    if ctype is None:
        return True
    subtype = ctype.split(b";")[0].strip().lower().rpartition(b"/")[2]
    return subtype == b"json" or subtype.endswith(b"+json")


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    value = next((v for k, v in headers if k == b"content-length"), None)
    return int(value) if value is not None and value.isdigit() else None


class BodyGuardMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, idle_s: float | None) -> None:
        self.app, self.max_bytes, self.idle_s = app, max_bytes, idle_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _declared_length(scope["headers"])
        if declared is not None and declared > self.max_bytes:
            return await self._too_large(send)
        try:
            body, ended = await self._read(receive)
        except _TooLarge:
            return await self._too_large(send)
        except asyncio.TimeoutError:
            return await send_error(send, 408, f"no byte of the request body arrived for {self.idle_s:g}s",
                                    headers=[(b"connection", b"close")])
        except _TooSlow:
            return await send_error(send, 408, f"the request body arrived slower than {MIN_BODY_RATE} bytes "
                                               "a second", headers=[(b"connection", b"close")])
        if ended:
            return  # the client left while sending its body: nobody reads an answer
        if body and _is_json(scope["headers"]):
            refusal = _judge_json(body, scope)
            if refusal is not None:
                return await send_error(send, 400, refusal[1], param=refusal[0])
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> tuple[bytes, bool]:
        """The whole body, and whether the client disconnected instead of finishing it."""
        chunks, size = [], 0
        start = time.monotonic()
        while True:
            wait = self.idle_s
            if wait is not None:  # the average rate, once the body has had `idle_s`
                left = start + self.idle_s + size / MIN_BODY_RATE - time.monotonic()
                if left <= 0:
                    raise _TooSlow
                wait = min(wait, left)
            try:
                message = await asyncio.wait_for(receive(), wait)
            except asyncio.TimeoutError:
                if wait is not None and wait < self.idle_s:
                    raise _TooSlow from None
                raise
            if message["type"] == "http.disconnect":
                return b"", True
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    async def _too_large(self, send: Send) -> None:
        # NOTE: the rest of the body is never read, so the connection cannot serve another request
        await send_error(send, 413, f"the request body is larger than {self.max_bytes} bytes "
                                    "(the server's --max-request-body-bytes)",
                         headers=[(b"connection", b"close")])


def _judge_json(body: bytes, scope: Scope) -> tuple[str | None, str] | None:
    """(param, message) of a 400 for a body that parses but nests too deeply, holds invalid text
    or is too large; None for a body to hand on, parsed (under `json_body.SCOPE_KEY`) unless it
    does not parse (then it gets the application's own 400)."""
    try:
        value = json_body.parse(body)
    except RecursionError:
        return None, f"the request body nests deeper than {MAX_JSON_DEPTH} levels"
    except ValueError:
        return None
    problem = find_problem(value)
    if problem is None:
        scope[json_body.SCOPE_KEY] = value  # the route reads it instead of parsing it again
        return None
    where = problem.path or "the request body"
    return problem.path or None, f"{where} {problem.message}"


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replaying() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaying
