"""Run the SGLang model gateway (`smg`, from PyPI) as a real process in front of real servers."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import httpx

from tests.server.server_process import API_KEY, LoggedProcess, free_port


def smg_available() -> bool:
    return importlib.util.find_spec("smg") is not None


class RouterProcess(LoggedProcess):
    name = "router"
    stop_timeout = 15.0

    def __init__(self, worker_urls: list[str], policy: str, log_path: Path, *extra: str) -> None:
        self.port, self.n_workers = free_port(), len(worker_urls)
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(self.port),
               "--prometheus-port", str(free_port()), "--worker-urls", *worker_urls, "--policy", policy,
               "--api-key", API_KEY, "--disable-tokenizer-autoload", "--log-level", "warn", *extra]
        super().__init__(cmd, log_path)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every worker is registered and healthy (the router's `/readiness` counts them)."""
        def ready() -> bool:
            r = httpx.get(f"{self.base}/readiness", timeout=2.0)
            return r.status_code == 200 and r.json().get("healthy_workers") == self.n_workers

        self._wait_for(ready, timeout, 0.3)
