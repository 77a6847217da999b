"""Progress lines and subprocess runs whose output goes to a log, with a heartbeat while they last."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

HEARTBEAT_S = 30.0
_T0 = time.monotonic()


class ImageBuildError(RuntimeError):
    """A step failed; the message names the step, its log and the tail of its output."""


def fmt(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


def log(msg: str) -> None:
    print(f"[images {fmt(time.monotonic() - _T0)}] {msg}", flush=True)


def run_logged(args: Sequence[str], log_path: Path, what: str, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> None:
    """Run `args` with stdout+stderr to `log_path`; say every HEARTBEAT_S that it still runs,
    with the log's last line (pip's and buildah's lines tell which step it is on)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(list(args), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        next_beat = start + HEARTBEAT_S
        while proc.poll() is None:
            time.sleep(1.0)
            if time.monotonic() >= next_beat:
                next_beat += HEARTBEAT_S
                log(f"  … {what}: {fmt(time.monotonic() - start)} so far | {last_line(log_path)}")
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise ImageBuildError(f"{what} failed (exit {proc.returncode}); full log: {log_path}\n{tail}")
    log(f"  {what}: done in {fmt(time.monotonic() - start)}")


def last_line(path: Path, width: int = 100) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:width] if lines else ""
