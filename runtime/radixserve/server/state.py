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
    from radixserve.config import ServerConfig
    from radixserve.server.sglang_api import ServerInfo

@dataclass
class ServerState:
    cfg: ServerConfig  # the flags (`--api-key`, `--default-max-tokens`, `--reasoning-parser`, …)
    frontend: Frontend
    metrics: ServerMetrics
    model_name: str
    model_path: str
    max_seq_len: int
    tool_parser: str | None = None  # the model's tool-call format (`tool_parsers.AUTO_PARSERS`)
    # the model's generation_config.json values for the sampling fields a request leaves out
    request_defaults: dict[str, float | int] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))
    dead_child: str | None = None  # set by the supervisor
    shutting_down: bool = False
    loop: asyncio.AbstractEventLoop | None = None  # the server's, for the supervisor thread
    probe: asyncio.Future | None = None  # the /health_generate generation in progress
    server_info: ServerInfo | None = None  # the configuration a gateway reads (`sglang_api.py`)
    # the LoRA adapters served, name -> path (as the scheduler last reported them)
    adapters: dict[str, str] = field(default_factory=dict)

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
