"""Detached background processes with pidfiles and logs, and stopping them.

Each process leads a new process group (``start_new_session=True``), so its process group id is its
pid and ``down`` can signal the whole group. ``<state>/run/<name>.pid`` holds the pid;
``<state>/logs/<name>.log`` its stdout and stderr.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

# Popen objects of processes started here: kept so that garbage collection never warns about a
# still-running child, and so ``stop`` can reap them.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created) for the block: one ``up``/``down``/build at a
    time, e.g. between pytest-xdist workers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pidfile(state: Path, name: str) -> Path:
    return state / "run" / f"{name}.pid"


def logfile(state: Path, name: str) -> Path:
    return state / "logs" / f"{name}.log"


def read_pid(state: Path, name: str) -> int | None:
    try:
        return int(pidfile(state, name).read_text().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _is_ours(pid: int, binary: str | None) -> bool:
    """The pid is alive (not a zombie) and, when given, runs ``binary`` (guards pid reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    if binary is None:
        return True
    argv = _cmdline(pid)
    return bool(argv) and os.path.basename(argv[0]) == os.path.basename(binary)


def running(state: Path, name: str, binary: str | None = None) -> int | None:
    """The pid of ``name`` if its pidfile points at a live process (running ``binary``)."""
    pid = read_pid(state, name)
    child = _CHILDREN.get(pid) if pid is not None else None
    if child is not None:
        # our own child: alive until it exits, whatever /proc shows (under load a just-started
        # child was once read with another argv and called dead while it came up)
        return pid if child.poll() is None else None
    if pid is not None and _is_ours(pid, binary):
        return pid
    return None


def start(state: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Start ``argv`` detached; stdout/stderr appended to its log; returns the pid."""
    log = logfile(state, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    pidfile(state, name).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=state,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    pidfile(state, name).write_text(f"{proc.pid}\n")
    return proc.pid


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(…, 0) also succeeds while only zombies are left; treat a lone zombie leader as gone.
    return _is_ours(pgid, None) or _group_has_live_member(pgid)


def _group_has_live_member(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def stop(state: Path, name: str, binary: str | None = None, grace_s: float = 5.0) -> bool:
    """SIGTERM the process group of ``name``, SIGKILL after ``grace_s``; removes the pidfile.

    Returns True if something was running. Only a pid from our pidfile whose process still runs
    ``binary`` (when given) is signalled, never a process found by name.
    """
    pid = read_pid(state, name)
    was_running = pid is not None and _is_ours(pid, binary)
    if was_running:
        assert pid is not None
        pgid = pid  # start_new_session: the leader's pid is the group id
        _signal_group(pgid, pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.1)
        if _group_alive(pgid):
            _signal_group(pgid, pid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.1)
        _reap(pid)
    pidfile(state, name).unlink(missing_ok=True)
    return was_running


def _signal_group(pgid: int, pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (started in this interpreter)."""
    proc = _CHILDREN.pop(pid, None)
    if proc is not None:
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])
