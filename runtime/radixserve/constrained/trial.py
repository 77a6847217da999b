"""A grammar's trial compilation in a forked child process: bounded in memory, and killed the
moment its caller says stop (a time limit, a request aborted). A
compilation inside the scheduler could be neither: xgrammar's compile cannot be interrupted, and
some grammars take minutes and gigabytes (a JSON schema with thousands of optional properties).

xgrammar's compiled grammar cannot come back cheaply (its JSON serialization is gigabytes where
the grammar takes megabytes), so the child only proves that the grammar compiles within the
limit and admits an output (`grammar_calls.dead_end`); the caller then compiles it in-process,
for about the time and memory the trial took.

The memory bound is kept twice: the child's own RLIMIT_DATA stops fresh mappings at once, and
the parent, polling, kills a child whose private dirty memory (every page it wrote since the fork)
passes the bound. RLIMIT_DATA alone misses the memory a long-running scheduler has freed but its
allocator keeps mapped: the child inherits those free chunks and may fill them without a new
mapping (seen: a 2,000-property schema compiled within a 100 MiB limit in a busy test worker).

NOTE: the child is forked from a process with threads (the scheduler's). It touches nothing but
xgrammar and numpy, writes one JSON line to its pipe and leaves with `os._exit` (no atexit, no zmq
or CUDA teardown); it dies with the thread that forked it (PR_SET_PDEATHSIG), so a scheduler that
dies leaves no compilation behind."""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import threading
import time
import warnings
from typing import Any

from radixserve.constrained.grammar_calls import GrammarError, compile_grammar, dead_end

_POLL_S = 0.05
_MESSAGE_CHARS = 4000  # what the child writes stays one pipe write (PIPE_BUF is 64 KiB)
_PR_SET_PDEATHSIG = 1


def _memory_in_use() -> int:
    """This process's data segment (what RLIMIT_DATA counts), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmData in /proc/self/status")


def _private_dirty(pid: int) -> int | None:
    """The bytes process `pid` has written since it was forked (None: the kernel does not say)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Private_Dirty:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _child(w: int, info: Any, kind: str, text: str, memory_bytes: int, parent: int) -> None:
    """Runs in the forked child; never returns."""
    out: dict[str, Any]
    try:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent left before the line above
            os._exit(1)
        limit = _memory_in_use() + memory_bytes  # NOTE: what the fork shares counts as in use
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        import xgrammar as xgr

        compiled = compile_grammar(xgr.GrammarCompiler(info, cache_enabled=False), kind, text)
        out = {"dead_end": dead_end(compiled)}
    except GrammarError as e:
        out = {"error": str(e)[:_MESSAGE_CHARS]}
    except MemoryError:
        out = {"memory": True}
    except BaseException as e:  # noqa: BLE001 -- reported to the parent, which decides
        out = {"internal": f"{type(e).__name__}: {e}"[:_MESSAGE_CHARS]}
    try:
        os.write(w, json.dumps(out).encode())
    finally:
        os._exit(0)


_FORK_TRIES = 100
_FORK_RETRY_S = 0.05


def _fork_once() -> int:
    with warnings.catch_warnings():  # Python 3.12 warns of fork in a threaded process: see NOTE
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _fork() -> int:
    # an audit hook may refuse the fork for now: filelock's, while another thread (a Triton or
    # FlashInfer compile) holds a lock file; it lets go within moments
    for _ in range(_FORK_TRIES - 1):
        try:
            return _fork_once()
        except RuntimeError:
            time.sleep(_FORK_RETRY_S)
    return _fork_once()


def try_compile(info: Any, kind: str, text: str, memory_mb: int, stop: threading.Event) -> bool:
    """Compile `text` in a child process with at most `memory_mb` MiB more memory than the
    scheduler's own: True when it compiled; GrammarError for a grammar that is invalid, admits no
    output or needs more memory; False when `stop` was set first (the child is killed; the caller
    knows why)."""
    if stop.is_set():
        return False
    r, w = os.pipe()
    try:
        pid = _fork()
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:  # pragma: no cover -- the child (coverage cannot follow it)
        # every other descriptor closed: another trial's pipe, open in the parent while this
        # child forked, would keep that trial from seeing its end until this child's
        os.closerange(3, w)
        os.closerange(w + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        _child(w, info, kind, text, memory_mb << 20, os.getppid())
    os.close(w)
    chunks: list[bytes] = []
    over = False
    try:
        while True:
            if stop.is_set():
                return False
            written = _private_dirty(pid)
            if written is not None and written > memory_mb << 20:
                over = True
                break
            if select.select([r], [], [], _POLL_S)[0]:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(r)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    _judge(kind, memory_mb, b'{"memory": true}' if over else b"".join(chunks), status)
    return True


def _judge(kind: str, memory_mb: int, data: bytes, status: int) -> None:
    """Raise what the child's report (or its death) says is wrong with the grammar, if anything."""
    if not data:  # it died before it could say why
        why = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit code {os.waitstatus_to_exitcode(status)}")
        raise GrammarError(kind, f"{kind}: the grammar's compilation ended abnormally ({why}); it "
                                 f"may need more than the {memory_mb} MiB of memory a compilation "
                                 "may use (RADIXSERVE_GRAMMAR_COMPILE_MEMORY_MB)")
    out = json.loads(data)
    if out.get("memory"):
        raise GrammarError(kind, f"{kind}: the grammar needs more than the {memory_mb} MiB of memory "
                                 "a compilation may use (RADIXSERVE_GRAMMAR_COMPILE_MEMORY_MB); "
                                 "simplify it")
    if "error" in out:
        raise GrammarError(kind, out["error"])
    if "internal" in out:
        raise RuntimeError(f"the grammar's trial compilation failed: {out['internal']}")
    if out.get("dead_end"):
        raise GrammarError(kind, f"{kind}: {out['dead_end']}")
