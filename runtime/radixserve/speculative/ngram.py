"""Prompt lookup: the tokens that followed the latest earlier occurrence of the request's last `n`
tokens, for the longest `n` in [min_match, max_match] that occurs. Repetitive output (code edits,
quoted summaries, structured text) drafts well; plain chat rarely matches, and then nothing is
drafted. Each request's `min_match`-grams are indexed as its tokens arrive (every start, latest
last), so a lookup probes one dictionary entry and compares a few candidates backwards, whatever
the context's length."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixserve.speculative.drafter import DRAFTERS, BaseDrafter

if TYPE_CHECKING:
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.core.request import Req
    from radixserve.engine.engine import Engine

CANDIDATES = 32  # the latest occurrences of the shortest n-gram compared backwards


class _Index:
    """Where each `lo`-gram of a token sequence starts, kept up to date as the sequence grows."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.tokens: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}
        self.indexed = 0  # lo-grams starting before this position are in `starts`

    def extend(self, tokens: list[int]) -> None:
        self.tokens += tokens
        # a lo-gram is indexed once a token follows it, so the suffix never matches itself
        while self.indexed + self.lo < len(self.tokens):
            i = self.indexed
            self.starts.setdefault(tuple(self.tokens[i: i + self.lo]), []).append(i)
            self.indexed += 1

    def lookup(self, k: int) -> list[int]:
        found = self.lookup_many(k, 1)
        return found[0] if found else []

    def lookup_many(self, k: int, breadth: int) -> list[list[int]]:
        """The continuations (up to k tokens) of up to `breadth` occurrences with distinct
        continuations, the longest match first, the latest among equals."""
        t, lo = self.tokens, self.lo
        if len(t) <= lo:
            return []
        matches = []  # (match length, start), latest first
        for start in reversed(self.starts.get(tuple(t[-lo:]), [])[-CANDIDATES:]):
            n = lo  # the match ends at start + lo; extend it backwards, up to hi
            while n < self.hi and start - (n - lo) > 0 and t[start - (n - lo) - 1] == t[-n - 1]:
                n += 1
            matches.append((n, start))
            if breadth == 1 and n == self.hi:
                break
        out: list[list[int]] = []
        for _, start in sorted(matches, key=lambda m: -m[0]):  # (stable: latest first)
            cont = t[start + lo: start + lo + k]
            if cont and cont not in out:
                out.append(cont)
                if len(out) == breadth:
                    break
        return out


@DRAFTERS.register("ngram")
class NgramDrafter(BaseDrafter):
    def __init__(self, min_match: int, max_match: int) -> None:
        self.min_match, self.max_match = min_match, max_match
        self._index: dict[int, _Index] = {}

    @classmethod
    def create(cls, engine_cfg: EngineConfig, cfg: SchedulerConfig, target: Engine,
               context: Any) -> NgramDrafter:
        return cls(cfg.speculative_ngram_min_match_window_size,
                   cfg.speculative_ngram_max_match_window_size)

    def _indexed(self, req: Req) -> _Index:
        """The request's index, caught up on its tokens."""
        index = self._index.get(req.uid)
        if index is None:
            index = self._index[req.uid] = _Index(self.min_match, self.max_match)
        index.extend(req.all_ids[len(index.tokens):])
        return index

    def propose(self, reqs: list[Req], lengths: list[int]) -> list[list[int]]:
        return [self._indexed(req).lookup(k) if k > 0 else [] for req, k in zip(reqs, lengths)]

    def propose_paths(self, reqs: list[Req], lengths: list[int],
                      breadth: int) -> list[list[list[int]]]:
        return [self._indexed(req).lookup_many(k, breadth) if k > 0 else []
                for req, k in zip(reqs, lengths)]

    def release(self, req: Req) -> None:
        self._index.pop(req.uid, None)
