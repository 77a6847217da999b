"""Two outermost ASGI layers: the API-key check (before the body is read or parsed, on every path
but the open ones) and a last-resort 500 that keeps the connection usable (Starlette's own error
middleware re-raises into uvicorn, which then drops the keep-alive connection)."""
from __future__ import annotations

import hmac
import json
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixserve.server.errors import error_body

logger = logging.getLogger("radixserve.server")


async def send_error(send: Send, status: int, message: str, code: str | None = None,
                     headers: list[tuple[bytes, bytes]] | None = None, param: str | None = None) -> None:
    """An OpenAI-style error response, sent by an ASGI layer before any handler runs."""
    body = json.dumps(error_body(status, message, param, code)).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    def __init__(self, app: ASGIApp, api_key: str | None, open_paths: frozenset[str]) -> None:
        self.app, self.key, self.open_paths = app, api_key, open_paths

    def _refusal(self, scope: Scope) -> str | None:
        """None when the request carries the key; else why not, in words."""
        given = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if given is None:
            return "You didn't provide an API key. Send it in an Authorization header: `Authorization: Bearer YOUR_KEY`."
        if given[:7].lower() != b"bearer ":
            return "The Authorization header must be `Bearer YOUR_KEY`."
        return None if hmac.compare_digest(given[7:], self.key.encode()) else "Incorrect API key provided."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.key is None or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal is None:
            return await self.app(scope, receive, send)
        await send_error(send, 401, refusal, "invalid_api_key", [(b"www-authenticate", b"Bearer")])


class CatchAllMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            logger.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await send_error(send, 500, "internal server error")
            else:  # end the half-sent response cleanly rather than resetting the connection
                await send({"type": "http.response.body", "body": b"", "more_body": False})
