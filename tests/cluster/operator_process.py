"""The operator as users run it: the `radixserve-operator` process, against a real API server,
with the ServiceAccount the manifests create (so RBAC is the manifests' own, not an admin's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# A hub that refuses at once: the cluster tier is air-gapped, deterministically.
OFFLINE_HUB = "http://127.0.0.1:9"


def token_kubeconfig(admin_kubeconfig: Path, token: str, out: Path) -> Path:
    """A kubeconfig for the same API server that authenticates with `token`."""
    cfg = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = cfg["clusters"][0]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [
            {"name": "operator", "context": {"cluster": cluster["name"], "user": "operator"}}
        ],
        "current-context": "operator",
    }
    out.write_text(yaml.safe_dump(doc))
    out.chmod(0o600)
    return out


@dataclass
class OperatorProcess:
    """One `radixserve-operator` process; `start` again after `stop` is a restart."""

    kubeconfig: Path
    log_path: Path
    args: tuple[str, ...] = ("--all-namespaces",)
    priority: int | None = None
    proc: subprocess.Popen | None = field(default=None, init=False)

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HF_ENDPOINT": OFFLINE_HUB,
            "HF_HUB_ETAG_TIMEOUT": "3",
            "HF_HUB_CACHE": str(self.log_path.parent / "hf-cache"),
        }
        args = [*self.args, "--liveness-port", "0"]
        if self.priority is not None:
            args += ["--priority", str(self.priority)]
        with open(self.log_path, "a") as log:  # the child keeps its own descriptor
            log.write(f"===== start {time.strftime('%H:%M:%S')}: {' '.join(args)}\n")
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "radixserve_operator", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        """Stop it (SIGKILL for a crash); returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self, tail: int = 200) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-tail:])
