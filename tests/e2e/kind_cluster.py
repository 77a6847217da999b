"""A throwaway kind cluster and a kubectl bound to its kubeconfig (never the user's default)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def run(cmd: list[str], *, timeout: float, check: bool = True, input: str | None = None) -> str:
    """Run a command; on failure raise with its output so the test log says what went wrong."""
    proc = subprocess.run(
        cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc.stdout


def missing_tools() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH"
    try:
        run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=30)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return f"no Docker engine reachable: {e}"
    return None


@dataclass(frozen=True)
class Kubectl:
    kubeconfig: Path
    binary: str = "kubectl"

    def __call__(
        self, *args: str, timeout: float = 120, check: bool = True, input: str | None = None
    ) -> str:
        return run(
            [self.binary, f"--kubeconfig={self.kubeconfig}", *args],
            timeout=timeout,
            check=check,
            input=input,
        )

    def json(self, *args: str, timeout: float = 60) -> dict[str, Any]:
        return json.loads(self(*args, "-o", "json", timeout=timeout))

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        out = self(
            "get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found", check=False
        )
        return json.loads(out) if out.strip() else None


@dataclass(frozen=True)
class KindCluster:
    name: str
    kubeconfig: Path

    @property
    def kubectl(self) -> Kubectl:
        return Kubectl(self.kubeconfig)

    def create(self) -> None:
        self.delete()  # a cluster left over from an interrupted run
        run(
            [
                "kind",
                "create",
                "cluster",
                "--name",
                self.name,
                "--kubeconfig",
                str(self.kubeconfig),
                "--wait",
                "180s",
            ],
            timeout=600,
        )

    def delete(self) -> None:
        run(
            [
                "kind",
                "delete",
                "cluster",
                "--name",
                self.name,
                "--kubeconfig",
                str(self.kubeconfig),
            ],
            timeout=300,
            check=False,
        )

    def load_image(self, image: str, workdir: Path) -> None:
        archive = workdir / (image.rsplit("/", 1)[-1].replace(":", "_") + ".tar")
        try:
            for cmd in load_commands(image, self.name, archive):
                run(cmd, timeout=900)
        finally:
            archive.unlink(missing_ok=True)


def build_command(repo: Path, target: str, tag: str) -> list[str]:
    """NOTE: --provenance=false: BuildKit attaches a provenance attestation by default, and with
    Docker >= 29 (the containerd image store) the image is then an index holding an attestation
    manifest, which the kind node's `ctr images import --all-platforms` cannot load."""
    return ["docker", "build", "--provenance=false", "--target", target, "--tag", tag, str(repo)]


def load_commands(image: str, cluster: str, archive: Path) -> list[list[str]]:
    """`docker save` to a file, then `kind load image-archive` (kind's maintainers' advice for
    Docker's containerd image store, kind#3795): the node imports exactly the archive saved, which
    for an image of build_command is one platform's manifest and nothing else. `kind load
    docker-image` pipes its own `docker save` of whatever the store holds under the tag."""
    return [
        ["docker", "save", "--output", str(archive), image],
        ["kind", "load", "image-archive", str(archive), "--name", cluster],
    ]


def build_image(repo: Path, target: str, tag: str) -> None:
    run(build_command(repo, target, tag), timeout=3600)


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 2.0) -> Any:
    """Poll `probe` until it returns something truthy; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")
