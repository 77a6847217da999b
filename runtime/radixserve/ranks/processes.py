"""The follower ranks as processes, seen from rank 0: how they are spawned, how rank 0 knows each
one is alive, and what it says when one is not.

Each follower holds the write end of a pipe. It sends `joining` just before it enters the group
and `failed: <reason>` if its start raises; rank 0 waits for every `joining` while watching the
processes' sentinels, so a rank that dies before the group forms (a failed import, a bad model, a
kill) fails rank 0 at once with that rank's name and reason, instead of after the rendezvous
timeout. Once the group exists, a watchdog thread notices a death between two steps and aborts
the NCCL communicators, so a collective blocked on the dead peer returns (gloo notices a closed
socket by itself)."""
from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import signal
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait

logger = logging.getLogger(__name__)

JOINING = b"joining"
FAILED = b"failed: "


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """NOTE: spawn makes each child import the parent's `__main__` again (by path, or by module
    name after `-m`). A rank needs only radixserve, and the user's main may not be importable
    (`python - < script.py`, a notebook cell) or may start ranks itself when run again (a script
    without an `if __name__ == "__main__"` guard); so while the ranks start, `__main__` shows
    spawn neither its path nor its module name."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def exit_reason(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class RankProcesses:
    """Ranks 1..N-1 as spawned processes, with a pipe from each."""

    def __init__(self, target, args_for_rank, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.procs: list = []
        self._pipes: list[Connection] = []
        self._said: dict[int, str] = {}  # rank -> what it reported that failed
        self._joining: set[int] = set()
        self._closing = threading.Event()
        with main_module_hidden():
            for rank in range(1, size):
                r, w = ctx.Pipe(duplex=False)
                p = ctx.Process(target=target, args=(*args_for_rank(rank), w), daemon=True,
                                name=f"radixserve-tp{rank}")
                p.start()
                w.close()  # only the child writes: its death closes the pipe
                self.procs.append(p)
                self._pipes.append(r)

    def _read(self, i: int) -> None:
        try:
            while self._pipes[i].poll():
                msg = self._pipes[i].recv_bytes()
                if msg == JOINING:
                    self._joining.add(i + 1)
                elif msg.startswith(FAILED):
                    self._said[i + 1] = msg[len(FAILED):].decode(errors="replace")
        except (EOFError, OSError):
            pass

    def describe(self, i: int) -> str:
        p = self.procs[i]
        self._read(i)
        said = f": {self._said[i + 1]}" if i + 1 in self._said else ""
        return f"tensor-parallel rank {i + 1} (pid {p.pid}) {exit_reason(p.exitcode)}{said}"

    def dead(self) -> str | None:
        """A line naming the first follower that has exited, and why; None if all run."""
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                p.join(timeout=1)  # NOTE: the sentinel fires a moment before exitcode is set
                return self.describe(i)
        return None

    def wait_joining(self, timeout_s: float) -> None:
        """Block until every follower is about to join the group; raise `RuntimeError` naming
        the first one that exits (or reports a failure) before that."""
        deadline = time.monotonic() + timeout_s
        while len(self._joining) < len(self.procs):
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = sorted(set(range(1, len(self.procs) + 1)) - self._joining)
                raise RuntimeError(
                    f"tensor-parallel: the group of {len(self.procs) + 1} did not form within "
                    f"{timeout_s:g} s: ranks {waiting} still starting (see their log; "
                    f"RADIXSERVE_TP_INIT_TIMEOUT_S sets the limit)")
            ready = wait([*self._pipes, *(p.sentinel for p in self.procs)], timeout=min(left, 1.0))
            for i, r in enumerate(self._pipes):
                if r in ready:
                    self._read(i)
            exited = [i for i, p in enumerate(self.procs) if p.sentinel in ready]
            if self._said or exited:
                i = next(iter(self._said)) - 1 if self._said else exited[0]
                self.procs[i].join(timeout=5)  # a failing rank reports, then exits
                raise RuntimeError(f"{self.describe(i)} while starting; the group cannot form")

    def watch(self, on_death) -> None:
        """Call `on_death(line)` from a daemon thread if a follower exits before `stop_watching`."""
        def run() -> None:
            wait([p.sentinel for p in self.procs])
            if not self._closing.is_set():
                on_death(self.dead() or "a tensor-parallel rank exited")

        threading.Thread(target=run, name="tp-watchdog", daemon=True).start()

    def stop_watching(self) -> None:
        self._closing.set()

    def reap(self, grace_s: float) -> None:
        """Wait up to `grace_s` (shared) for the followers to exit, then kill the rest."""
        self._closing.set()
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                log = logger.warning if grace_s > 0 else logger.debug  # 0: no time was given
                log("tensor-parallel rank %s (pid %d) did not exit; killing it",
                    p.name.removeprefix("radixserve-tp"), p.pid)
                p.kill()
                p.join()
        for r in self._pipes:
            r.close()
