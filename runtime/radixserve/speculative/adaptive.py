"""How many tokens to draft for a request next. Verifying a draft costs the target a token of
compute and the step its overlap with the host (`scheduler.py`), and pays only the drafts kept:
so each request drafts by how many of its recent drafts were kept. Its acceptance is a moving
average of kept/drafted; at or above `FULL` it drafts the most tokens, below it fewer in
proportion, and below `OFF` none at all for a while (`COOLDOWN` steps), then one token, to see
whether its text became predictable again (a repetitive stretch in otherwise plain chat).

Resting requests probe together, on the steps of a shared clock that are multiples of `COOLDOWN`:
a step in which any request drafts is a verification step for the whole batch (read
synchronously, an extend batch), so probes spread over the steps of many requests would leave
few plain decode steps at a large batch (measured: the floor of `bench speculative --bracket`)."""
from __future__ import annotations

from dataclasses import dataclass

FULL = 0.6  # acceptance at which a request drafts all `max_tokens` tokens
OFF = 0.15  # below it, none for COOLDOWN steps
COOLDOWN = 16
SMOOTHING = 0.5  # weight of the latest step in the moving average


@dataclass
class _Record:
    acceptance: float = 1.0  # optimistic: a request starts drafting in full
    until: int = 0  # resting: the clock's step at which it probes again (0: not resting)


class DraftLengths:
    def __init__(self, most: int) -> None:
        self.most = most
        self._records: dict[int, _Record] = {}
        self.step = 0  # the shared clock: steps planned so far

    def tick(self) -> None:
        """A step was planned."""
        self.step += 1

    def wants(self, uid: int) -> bool:
        """Whether `next` would draft for the request (it changes nothing)."""
        rec = self._records.get(uid)
        return rec is None or self.step >= rec.until

    def next(self, uid: int) -> int:
        rec = self._records.setdefault(uid, _Record())
        if rec.until:
            if self.step < rec.until:
                return 0
            rec.until = 0
            return 1  # the probe
        if rec.acceptance >= FULL:
            return self.most
        return max(1, round(self.most * rec.acceptance / FULL))

    def observe(self, uid: int, drafted: int, kept: int) -> None:
        rec = self._records.setdefault(uid, _Record())
        rate = kept / drafted if drafted else rec.acceptance
        rec.acceptance = (1 - SMOOTHING) * rec.acceptance + SMOOTHING * rate
        if rec.acceptance < OFF:  # rest at least COOLDOWN steps, to the next shared probe
            rec.until = (self.step // COOLDOWN + 2) * COOLDOWN

    def forget(self, uid: int) -> None:
        self._records.pop(uid, None)


class FixedDraftLengths(DraftLengths):
    """Every request drafts `most` tokens every step, whatever it kept: the bench's ceiling, where
    a verification step of the same rows every time rounds the same way in every run (a back-off
    to one-token steps would round the tokens after a rejection differently)."""

    def wants(self, uid: int) -> bool:
        return True

    def next(self, uid: int) -> int:
        return self.most

    def observe(self, uid: int, drafted: int, kept: int) -> None:
        pass
