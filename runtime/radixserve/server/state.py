"""What the HTTP handlers share: the frontend, metrics, the served model's identity and the
health of the child processes; plus the API-key check."""
from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from radixserve.server.errors import APIError
from radixserve.server.frontend import Frontend
from radixserve.server.metrics import ServerMetrics

HEARTBEAT_TIMEOUT_S = 5.0


@dataclass
class ServerState:
    frontend: Frontend
    metrics: ServerMetrics
    model_name: str
    model_path: str
    max_seq_len: int
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    dead_child: str | None = None  # set by the supervisor
    shutting_down: bool = False
    loop: asyncio.AbstractEventLoop | None = None  # the server's, for the supervisor thread

    def unhealthy_reason(self) -> str | None:
        if self.dead_child:
            return f"child process {self.dead_child} died"
        if self.shutting_down:
            return "shutting down"
        if self.frontend.heartbeat_age() > HEARTBEAT_TIMEOUT_S:
            return f"no scheduler heartbeat for {self.frontend.heartbeat_age():.1f}s"
        return None


def get_state(request: Request) -> ServerState:
    return request.app.state.server


def authorize(request: Request) -> None:
    key = get_state(request).api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(token.encode(), key.encode()):
        raise APIError(401, "Incorrect API key provided.", None, "invalid_api_key")


StateDep = Annotated[ServerState, Depends(get_state)]
