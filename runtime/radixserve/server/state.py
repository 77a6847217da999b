"""What the HTTP handlers share: the frontend, metrics, the served model's identity, the serving
limits and the health of the child processes."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from radixserve import settings
from radixserve.server.frontend import Frontend
from radixserve.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from radixserve.server.sglang_api import ServerInfo

# No heartbeat for this long: the scheduler process is dead or frozen (its heartbeat thread runs
# whatever its loop does). One loop iteration running this long: the scheduler is stuck.
DEFAULT_MAX_TOKENS = 2048
DEFAULT_MAX_BODY_BYTES = 32 << 20  # a full 128k-token context as JSON text fits many times
DEFAULT_BODY_IDLE_S = 30.0


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
    tool_parser: str | None = None  # the model's tool-call format (`tool_parsers.AUTO_PARSERS`)
    reasoning_parser: str | None = None  # `--reasoning-parser` (postprocess/reasoning.py), None: no split
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)  # for unset fields
    created: int = field(default_factory=lambda: int(time.time()))
    dead_child: str | None = None  # set by the supervisor
    shutting_down: bool = False
    loop: asyncio.AbstractEventLoop | None = None  # the server's, for the supervisor thread
    probe: asyncio.Future | None = None  # the /health_generate generation in progress
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a larger request body gets a 413 (body_guard.py)
    body_idle_s: float | None = DEFAULT_BODY_IDLE_S  # a body stalled this long gets a 408
    server_info: ServerInfo | None = None  # the configuration a gateway reads (`sglang_api.py`)

    def unhealthy_reason(self) -> str | None:
        if self.dead_child:
            return f"child process {self.dead_child} died"
        if self.shutting_down:
            return "shutting down"
        if self.frontend.heartbeat_age() > settings.HEARTBEAT_TIMEOUT_S.get():
            return f"no scheduler heartbeat for {self.frontend.heartbeat_age():.1f}s"
        if self.frontend.step_age > settings.STUCK_STEP_S.get():
            return f"the scheduler has been stuck in one step for {self.frontend.step_age:.0f}s"
        return None


def get_state(request: Request) -> ServerState:
    return request.app.state.server


StateDep = Annotated[ServerState, Depends(get_state)]
