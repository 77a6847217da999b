"""`RADIXSERVE_STACK_DUMP_S=N`: every radixserve process prints the Python stacks of all its
threads to stderr every N seconds. For a process that is stuck (a tensor-parallel group that
never forms, a collective a rank never joins), this shows where each rank waits."""
from __future__ import annotations

import faulthandler
import os
import sys

from radixserve import settings

ENV = settings.STACK_DUMP_S.name


def enable_stack_dumps(label: str) -> None:
    """Start the periodic dump if `RADIXSERVE_STACK_DUMP_S` is set (one timer per process)."""
    secs = settings.STACK_DUMP_S.get()
    if secs is None:
        return
    print(f"[{label}] pid {os.getpid()}: Python stacks every {secs:g} s ({ENV})",
          file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(secs, repeat=True, file=sys.stderr)
