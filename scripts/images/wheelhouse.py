"""The wheelhouse: every pinned wheel, filled by the host's pip, read by the builds offline.

Layout under paths.wheelhouse():
  wheels/                 the wheels of every lock (pip finds what it already has there first)
  .filled-<lock>          the digest of the constraints file last filled, so a fill is skipped
  locks/<digest>/         the constraints and one pip.conf per image, as the builds see them at
                          /wheelhouse; the digest in the path makes a new lock a new build arg,
                          which is what invalidates the builds' cached pip layers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from . import constraints
from .cachekey import image_key, text_digest
from .paths import logs_dir, wheelhouse
from .progress import log, run_logged
from .specs import ImageSpec

MOUNT = "/wheelhouse"  # where the builds see the wheelhouse (read-only)


def fill_command(lock_file: Path, wheel_dir: Path) -> list[str]:
    """pip wheel of exact pins, each on its own (--no-deps: the lock is the resolution); wheels
    already in `wheel_dir` are taken from there, sdists are built into wheels on the host."""
    return [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps",
            "--progress-bar", "off", "--wheel-dir", str(wheel_dir), "--find-links", str(wheel_dir),
            "-r", str(lock_file)]


def fill(locks: Iterable[str]) -> Path:
    wheels = wheelhouse() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for lock in locks:
        text = constraints.path(lock).read_text()
        constraints.parse(text)  # a malformed lock fails here, not inside a build
        stamp = wheelhouse() / f".filled-{lock}"
        if stamp.exists() and stamp.read_text() == text_digest(text):
            log(f"wheelhouse {lock}: cached")
            continue
        log(f"wheelhouse {lock}: pip wheel of {len(constraints.parse(text))} pins into {wheels}")
        run_logged(fill_command(constraints.path(lock), wheels), logs_dir() / f"wheelhouse-{lock}.log",
                   f"wheelhouse {lock}")
        stamp.write_text(text_digest(text))
    return wheels


def pip_conf(locks: Iterable[str], lock_dir: str) -> str:
    """The builds' pip settings: the wheelhouse only, and the locks' pins as constraints."""
    cons = " ".join(f"{lock_dir}/{lock}.txt" for lock in locks)
    return (
        "[global]\n"
        "no-index = true\n"
        f"find-links = {MOUNT}/wheels\n"
        f"constraint = {cons}\n"
        "disable-pip-version-check = true\n"
        "no-cache-dir = true\n"
    )


def locks_digest(locks: Iterable[str]) -> str:
    return image_key({lock: text_digest(constraints.path(lock).read_text()) for lock in locks})


def stage_config(spec: ImageSpec) -> str:
    """Write the image's locks and pip.conf into the wheelhouse; the path the build passes as
    PIP_CONFIG_FILE (inside the mount)."""
    digest = locks_digest(spec.locks)[:16]
    constraints.merged(spec.locks)  # one version of each package across the image's locks
    host_dir = wheelhouse() / "locks" / digest
    host_dir.mkdir(parents=True, exist_ok=True)
    mount_dir = f"{MOUNT}/locks/{digest}"
    for lock in spec.locks:
        (host_dir / f"{lock}.txt").write_text(constraints.path(lock).read_text())
    conf = host_dir / f"pip-{spec.name}.conf"
    conf.write_text(pip_conf(spec.locks, mount_dir))
    return f"{mount_dir}/{conf.name}"
