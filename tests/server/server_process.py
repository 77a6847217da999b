"""Run `python -m radixserve serve` as a real process on a free loopback port."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

API_KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoggedProcess:
    """A child process whose output goes to a log file, stopped with SIGTERM (then SIGKILL)."""

    name = "process"
    stop_timeout = 30.0

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 -- open for the process's lifetime
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_for(self, ready: Callable[[], bool], timeout: float, interval: float) -> None:
        """Poll `ready` (an HTTP error or a bad body counts as not yet) until it holds; stop the
        process and raise with its log's tail when it exits or `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                if ready():
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(interval)
        self.stop()
        raise RuntimeError(f"{self.name} not ready within {timeout}s:\n{self.log()[-4000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


class ServerProcess(LoggedProcess):
    name = "server"

    def __init__(self, model: Path | None, log_path: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixserve", "serve", "--port", str(self.port), "--device", "cpu", *extra]
        if model is not None:
            cmd += ["--model", str(model)]
        env = os.environ | {"RADIXSERVE_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"} | (env or {})
        super().__init__(cmd, log_path, env)

    def wait_ready(self, timeout: float = 180.0) -> None:
        self._wait_for(lambda: httpx.get(f"{self.base}/health", timeout=1.0).status_code == 200,
                       timeout, 0.2)

    def metrics(self) -> dict[str, float]:
        """Unlabelled samples of /metrics (labelled ones keep their label text in the name)."""
        out = {}
        r = httpx.get(f"{self.base}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def child_pid(self, name: str) -> int:
        """A child's pid, from the line the server logs when it starts one."""
        m = re.search(rf"started {re.escape(name)} \(pid (\d+)\)", self.log())
        assert m, f"no pid logged for {name}"
        return int(m.group(1))
