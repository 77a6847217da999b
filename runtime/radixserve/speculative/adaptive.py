"""How many tokens to draft for a request next. Verifying a draft costs the target a token of
compute and the step its overlap with the host (`scheduler.py`), and pays only the drafts kept:
so each request drafts by how many of its recent drafts were kept. Its acceptance is a moving
average of kept/drafted; at or above `FULL` it drafts the most tokens, below it fewer in
proportion, and below `OFF` none at all for a while (`COOLDOWN` steps), then one token, to see
whether its text became predictable again (a repetitive stretch in otherwise plain chat)."""
from __future__ import annotations

from dataclasses import dataclass

FULL = 0.6  # acceptance at which a request drafts all `max_tokens` tokens
OFF = 0.15  # below it, none for COOLDOWN steps
COOLDOWN = 16
SMOOTHING = 0.5  # weight of the latest step in the moving average


@dataclass
class _Record:
    acceptance: float = 1.0  # optimistic: a request starts drafting in full
    rest: int = 0  # steps left without drafting


class DraftLengths:
    def __init__(self, most: int) -> None:
        self.most = most
        self._records: dict[int, _Record] = {}

    def wants(self, uid: int) -> bool:
        """Whether `next` would draft for the request (it changes nothing)."""
        rec = self._records.get(uid)
        return rec is None or rec.rest <= 1

    def next(self, uid: int) -> int:
        rec = self._records.setdefault(uid, _Record())
        if rec.rest > 0:
            rec.rest -= 1
            return 1 if rec.rest == 0 else 0  # the last rest step probes with one token
        if rec.acceptance >= FULL:
            return self.most
        return max(1, round(self.most * rec.acceptance / FULL))

    def observe(self, uid: int, drafted: int, kept: int) -> None:
        rec = self._records.setdefault(uid, _Record())
        rate = kept / drafted if drafted else rec.acceptance
        rec.acceptance = (1 - SMOOTHING) * rec.acceptance + SMOOTHING * rate
        if rec.acceptance < OFF:
            rec.rest = COOLDOWN

    def forget(self, uid: int) -> None:
        self._records.pop(uid, None)
