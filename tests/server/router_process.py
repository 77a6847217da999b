"""Run the SGLang model gateway (`smg`, from PyPI) as a real process in front of real servers."""
from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.server.server_process import API_KEY, free_port


def smg_available() -> bool:
    return importlib.util.find_spec("smg") is not None


class RouterProcess:
    def __init__(self, worker_urls: list[str], policy: str, log_path: Path, *extra: str) -> None:
        self.port, self.n_workers = free_port(), len(worker_urls)
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(self.port),
               "--prometheus-port", str(free_port()), "--worker-urls", *worker_urls, "--policy", policy,
               "--api-key", API_KEY, "--disable-tokenizer-autoload", "--log-level", "warn", *extra]
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 -- open for the router's lifetime
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every worker is registered and healthy (the router's `/readiness` counts them)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                r = httpx.get(f"{self.base}/readiness", timeout=2.0)
                if r.status_code == 200 and r.json().get("healthy_workers") == self.n_workers:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"router not ready within {timeout}s:\n{self.log()[-4000:]}")

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
