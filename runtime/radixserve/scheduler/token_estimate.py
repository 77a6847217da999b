"""Optimistic admission's estimate of the KV the running requests will still write (SGLang's
new-token ratio). A request is admitted when its prompt, its own tokens to come (`upper`) and
`ratio` times those of every running request (`expected`) fit the free and evictable KV, instead
of every request's whole `max_tokens`: most answers end long before it.

The ratio starts at `INIT_RATIO` (times `--schedule-conservativeness`, at most 1), decays by one
`DECAY_STEPS`-th of the way to its floor each decode step, and is raised again when decoding runs
out of KV and requests are retracted (to what the remaining ones have used of their budgets, plus
`RETRACT_STEPS` tokens of headroom each). Its floor adapts to the finished requests: `MIN_RATIO`,
or more when they use a larger share of their `max_tokens` (a moving average, scaled like the
rest), so a workload whose answers run to their limit stops over-admitting. Once requests have
finished, the ratio also closes a `FINISHED_STEPS`-th of its distance to the floor each step
(whichever is faster): the finishes measured what the blind linear decay only guesses at, so a
chat workload whose answers are a tenth of their `max_tokens` reaches its batch in some sixty
steps, not six hundred (a retraction still raises it). On the chat workload of
`bench offline --compare-admission` (answers of 100-800 of 4,096 tokens), a 100th of the distance a
step took 10% more steps than closing it at once; a 20th, none. Deterministic from the scheduler's state,
so every TP rank computes the same."""
from __future__ import annotations

from collections.abc import Iterable

from radixserve.core.request import Req

CLIP_MAX_NEW_TOKENS = 4096  # a larger max_tokens counts as this much (estimation only)
INIT_RATIO = 0.7
MIN_RATIO = 0.14
DECAY_STEPS = 600
FINISHED_STEPS = 20  # with finishes observed: the share of the distance to the floor per step
RETRACT_STEPS = 20  # after a retraction the rest must fit this many more tokens each
_FINISH_WEIGHT = 0.05  # of the newest finish in the moving average


class TokenEstimate:
    def __init__(self, conservativeness: float) -> None:
        self.scale = conservativeness
        self.init = min(1.0, INIT_RATIO * conservativeness)
        self.min = min(self.init, MIN_RATIO * conservativeness)
        self.decay = (self.init - self.min) / DECAY_STEPS
        self.ratio = self.init
        self.used: float | None = None  # moving average of generated / max_tokens at finish

    @staticmethod
    def upper(req: Req) -> int:
        """The tokens it may still write (clipped): what a newly admitted request counts."""
        return min(req.tokens_left, CLIP_MAX_NEW_TOKENS)

    def expected(self, running: Iterable[Req]) -> float:
        """The tokens the running requests are expected to write still."""
        return self.ratio * sum(self.upper(r) for r in running)

    @property
    def floor(self) -> float:
        if self.used is None:
            return self.min
        return min(self.init, max(self.min, self.scale * self.used))

    def decode_step(self) -> None:
        floor = self.floor
        step = self.decay
        if self.used is not None:
            step = max(step, (self.ratio - floor) / FINISHED_STEPS)
        self.ratio = max(floor, self.ratio - step)

    def finished(self, req: Req) -> None:
        share = len(req.output_ids) / req.params.max_tokens
        self.used = share if self.used is None else (
            (1 - _FINISH_WEIGHT) * self.used + _FINISH_WEIGHT * share)

    def retracted(self, kept: list[Req]) -> None:
        """Requests were retracted for lack of KV: estimate from what `kept` have used."""
        made = sum(len(r.output_ids) for r in kept)
        budget = sum(r.params.max_tokens for r in kept)
        self.ratio = min(1.0, (made + RETRACT_STEPS * len(kept)) / (budget + 1))

    def idle(self) -> None:
        self.ratio = self.init
