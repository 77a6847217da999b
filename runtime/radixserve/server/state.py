"""What the HTTP handlers share: the frontend, metrics, the served model's identity, the serving
limits and the health of the child processes."""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from radixserve.server.frontend import Frontend
from radixserve.server.metrics import ServerMetrics

# No heartbeat for this long: the scheduler process is dead or frozen (its heartbeat thread runs
# whatever its loop does). One loop iteration running this long: the scheduler is stuck.
HEARTBEAT_TIMEOUT_S = float(os.environ.get("RADIXSERVE_HEARTBEAT_TIMEOUT_S", "5"))
STUCK_STEP_S = float(os.environ.get("RADIXSERVE_STUCK_STEP_S", "600"))
DEFAULT_MAX_TOKENS = 2048


@dataclass
class ServerState:
    frontend: Frontend
    metrics: ServerMetrics
    model_name: str
    model_path: str
    max_seq_len: int
    api_key: str | None = None
    default_max_tokens: int = DEFAULT_MAX_TOKENS  # a chat request without max_tokens
    metrics_open: bool = False  # /metrics without the key
    created: int = field(default_factory=lambda: int(time.time()))
    dead_child: str | None = None  # set by the supervisor
    shutting_down: bool = False
    loop: asyncio.AbstractEventLoop | None = None  # the server's, for the supervisor thread
    probe: asyncio.Future | None = None  # the /health_generate generation in progress

    def unhealthy_reason(self) -> str | None:
        if self.dead_child:
            return f"child process {self.dead_child} died"
        if self.shutting_down:
            return "shutting down"
        if self.frontend.heartbeat_age() > HEARTBEAT_TIMEOUT_S:
            return f"no scheduler heartbeat for {self.frontend.heartbeat_age():.1f}s"
        if self.frontend.step_age > STUCK_STEP_S:
            return f"the scheduler has been stuck in one step for {self.frontend.step_age:.0f}s"
        return None


def get_state(request: Request) -> ServerState:
    return request.app.state.server


StateDep = Annotated[ServerState, Depends(get_state)]
