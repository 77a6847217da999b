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
        # oldest first (a dict keeps insertion order): only the expired are touched, so a flood of
        # aborts costs each one O(1), not a scan of every tombstone younger than the TTL
        while self._tombstones:
            oldest, at = next(iter(self._tombstones.items()))
            if now - at <= self.ttl_s:
                break
            del self._tombstones[oldest]
        self._tombstones.pop(uid, None)  # (re-inserted last: the order stays the age order)
        self._tombstones[uid] = now

    def take_tombstone(self, uid: int) -> bool:
        """True (once) if the request was aborted before it arrived."""
        return self._tombstones.pop(uid, None) is not None
