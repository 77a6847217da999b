"""`--schedule-policy`: the order in which waiting requests are offered to admission, within each
priority (lower first, as always). SGLang's names and meanings:

- `fcfs`: arrival order (a retracted request first: it goes back to the head of the queue).
- `lpm`: longest prefix match first: the requests whose prompts the prefix cache (device or host
  tier) holds most of, so that prefill computes the least while the shared prefixes are cached.
  Above `LPM_MAX_QUEUE` waiting requests it orders by arrival (matching each would cost more
  than it saves, as SGLang).
- `dfs-weight`: the prefix tree walked depth first, the subtree where more waiting requests match
  first: requests sharing a prefix go together, the most shared one first.

Starvation bound: a waiting request that `MAX_BYPASS` later arrivals of its priority (or a more
urgent one) were admitted before is due; due requests precede the others of their priority, in
arrival order, so from then on it waits only as under `fcfs` (where `PrefillAdder` lets at most
`MAX_OVERTAKES` smaller requests pass one that does not fit). The policies only order: admission
itself (`prefill.py`) is the same for all."""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from radixserve.core.request import Req

if TYPE_CHECKING:
    from radixserve.scheduler.cache_manager import CacheManager

LPM_MAX_QUEUE = 128
MAX_BYPASS = 32


def match_ids(req: Req) -> list[int]:
    """What admission looks up in the prefix cache: the tokens before the last one to prefill
    (always computed), or none for a request that wants every prompt logprob."""
    if req.params.prompt_logprobs is not None and not req.output_ids:
        return []
    return req.fill_ids[:-1]


class SchedulePolicy:
    def __init__(self, name: str, cache: CacheManager) -> None:
        self.name, self.cache = name, cache

    def order(self, waiting: deque[Req]) -> list[Req]:
        """The waiting requests (kept in priority, then arrival order) in the order to offer."""
        reqs = list(waiting)
        if self.name == "fcfs" or len(reqs) < 2 or (self.name == "lpm" and len(reqs) > LPM_MAX_QUEUE):
            return reqs
        due = [r for r in reqs if r.overtaken >= MAX_BYPASS]
        rest = [r for r in reqs if r.overtaken < MAX_BYPASS]
        matches = [self.cache.match(match_ids(r), r.namespace) for r in rest]
        if self.name == "lpm":
            hits = {id(r): m.cached_len + m.host_len for r, m in zip(rest, matches)}
            rest.sort(key=lambda r: -hits[id(r)])
        else:
            rest = [rest[i] for i in self.cache.dfs_order([m.handle for m in matches])]
        # stable: priority first, then due ones in arrival order, then the policy's order
        rank = {id(r): i for i, r in enumerate(due + rest)}
        return sorted(reqs, key=lambda r: (r.params.priority, rank[id(r)]))

    def admitted(self, req: Req, waiting: deque[Req]) -> None:
        """`req` was admitted: every earlier arrival still waiting at its priority or a more
        urgent one was passed once more."""
        if self.name == "fcfs":
            return
        for w in waiting:
            if w.arrival < req.arrival and w.params.priority <= req.params.priority:
                w.overtaken += 1
