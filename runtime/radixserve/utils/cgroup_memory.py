"""How much memory this process's container may still take: its cgroup's limit minus its usage.

A CPU pod's KV cache is sized from this, so a 4 GiB container never allocates a 2 GiB cache on top
of the weights and three Python processes and meets the OOM killer. cgroup v2 (``memory.max``,
``memory.current``) and v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``), read where a
container sees its own cgroup, or under the path ``/proc/self/cgroup`` names.
"""
from __future__ import annotations

from pathlib import Path

NO_LIMIT = 1 << 60  # v1 reports "no limit" as a number near 2**63
_FILES = (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes"))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def _candidate_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    dirs = [root, root / "memory"]
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2 unified
            dirs.append(root / path.lstrip("/"))
        elif "memory" in controllers.split(","):
            dirs.append(root / "memory" / path.lstrip("/"))
    return dirs


def headroom_bytes(root: Path = Path("/sys/fs/cgroup"),
                   proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """Bytes left under the tightest memory limit found, or None where there is no limit."""
    best: int | None = None
    for d in _candidate_dirs(root, proc_cgroup):
        for limit_name, usage_name in _FILES:
            limit, usage = _read_int(d / limit_name), _read_int(d / usage_name)
            if limit is None or usage is None or limit >= NO_LIMIT:
                continue
            left = max(0, limit - usage)
            best = left if best is None else min(best, left)
    return best
