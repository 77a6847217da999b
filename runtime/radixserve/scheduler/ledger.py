"""The uids a scheduler no longer holds, so that an abort and its request may arrive in either
order: an abort of a finished request is a no-op, and an abort that overtakes its request (the
client left while the prompt was being tokenized) leaves a tombstone that drops the request when
it comes.

Both memories are bounded: finished uids by count (uids are never reused), tombstones by age (a
request that never comes must not be remembered forever)."""
from __future__ import annotations

import time
from collections import OrderedDict

_FINISHED_MEMORY = 1 << 16
_TOMBSTONE_TTL_S = 120.0


class RequestLedger:
    def __init__(self, memory: int = _FINISHED_MEMORY, ttl_s: float = _TOMBSTONE_TTL_S) -> None:
        self.memory, self.ttl_s = memory, ttl_s
        self._finished: OrderedDict[int, None] = OrderedDict()
        self._tombstones: dict[int, float] = {}  # uid -> monotonic time of the abort

    def __len__(self) -> int:
        return len(self._tombstones)

    def finished(self, uid: int) -> None:
        self._finished[uid] = None
        while len(self._finished) > self.memory:
            self._finished.popitem(last=False)

    def is_finished(self, uid: int) -> bool:
        return uid in self._finished

    def tombstone(self, uid: int) -> None:
        now = time.monotonic()
        expired = [u for u, t in self._tombstones.items() if now - t > self.ttl_s]
        for u in expired:
            del self._tombstones[u]
        self._tombstones[uid] = now

    def take_tombstone(self, uid: int) -> bool:
        """True (once) if the request was aborted before it arrived."""
        return self._tombstones.pop(uid, None) is not None
