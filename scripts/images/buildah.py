"""The buildah command lines (pure, so tests read them) and the calls that run them."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from .progress import ImageBuildError
from .wheelhouse import MOUNT


def bud_command(repo: Path, target: str, tag: str, wheelhouse: Path,
                build_args: Mapping[str, str]) -> list[str]:
    """`buildah bud` of one Dockerfile target: layers cached in buildah's storage, no network in
    any RUN, no pull (the base is local), the wheelhouse mounted read-only into every RUN.
    Docker's manifest format, since OCI's has no HEALTHCHECK."""
    cmd = ["buildah", "bud", "--layers", "--network=none", "--pull=never", "--format=docker",
           "--target", target, "--tag", tag, "--file", str(repo / "Dockerfile"),
           "--volume", f"{wheelhouse}:{MOUNT}:ro"]
    for key in sorted(build_args):
        cmd += ["--build-arg", f"{key}={build_args[key]}"]
    return [*cmd, str(repo)]


def push_command(tag: str, archive: Path) -> list[str]:
    """A docker-archive that names the image, for `ctr -n k8s.io images import`."""
    return ["buildah", "push", "--quiet", tag, f"docker-archive:{archive}:{tag}"]


def run_command(container: str, argv: list[str]) -> list[str]:
    return ["buildah", "run", "--network=none", container, "--", *argv]


def call(args: list[str], timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr)[-4000:]
        raise ImageBuildError(f"{' '.join(args[:3])} … failed (exit {proc.returncode}):\n{out}")
    return proc
