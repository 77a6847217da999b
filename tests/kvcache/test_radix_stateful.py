"""Random insert/match/lock/unlock/evict sequences on the radix cache, checked step by step
against a plain reference model: a dict from every cached page-aligned prefix to the slots of its
last page, plus the list of live locks."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixserve.kvcache import RadixPrefixCache

NUM_PATTERNS = 3
SETTINGS = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def page_tokens(pattern: int, page_size: int) -> list[int]:
    # Pages share all but their last token, so a query diverging inside a page must not count it.
    return [7] * (page_size - 1) + [pattern]


class RadixMachine(RuleBasedStateMachine):
    page_size = 1

    @initialize()
    def setup(self) -> None:
        self.cache = RadixPrefixCache(self.page_size, "cpu")
        self.pages: dict[tuple[int, ...], tuple[int, ...]] = {}  # prefix -> its last page's slots
        self.touched: dict[tuple[int, ...], int] = {}  # prefix -> model time of last access
        self.locks: list[tuple[object, tuple[int, ...]]] = []  # (handle, locked prefix)
        self.clock = 0
        self.next_page = 0

    # -- the reference model -------------------------------------------------------------------
    def tokens(self, patterns: list[int]) -> tuple[int, ...]:
        return tuple(t for p in patterns for t in page_tokens(p, self.page_size))

    def prefixes(self, ids: tuple[int, ...]) -> list[tuple[int, ...]]:
        ps = self.page_size
        return [ids[: end] for end in range(ps, len(ids) - len(ids) % ps + 1, ps)]

    def model_match(self, ids: tuple[int, ...]) -> list[tuple[int, ...]]:
        matched = []
        for prefix in self.prefixes(ids):
            if prefix not in self.pages:
                break
            matched.append(prefix)
        return matched

    def touch(self, prefixes: list[tuple[int, ...]]) -> None:
        self.clock += 1
        for prefix in prefixes:
            self.touched[prefix] = self.clock

    def protected(self) -> set[tuple[int, ...]]:
        return {p for _, locked in self.locks for p in self.prefixes(locked)}

    def leaves(self) -> set[tuple[int, ...]]:
        parents = {p[: -self.page_size] for p in self.pages}
        return set(self.pages) - parents

    def fresh_slots(self, num_pages: int) -> list[int]:
        first = self.next_page
        self.next_page += num_pages
        return list(range(first * self.page_size, self.next_page * self.page_size))

    # -- rules ---------------------------------------------------------------------------------
    @rule(patterns=st.lists(st.integers(0, NUM_PATTERNS - 1), max_size=5))
    def insert(self, patterns: list[int]) -> None:
        ids = self.tokens(patterns)
        slots = self.fresh_slots(len(patterns))
        expected = len(self.model_match(ids)) * self.page_size
        already = self.cache.insert_prefix(list(ids), torch.tensor(slots, dtype=torch.int64))
        assert already == expected
        ps = self.page_size
        for i, prefix in enumerate(self.prefixes(ids)):
            self.pages.setdefault(prefix, tuple(slots[i * ps : (i + 1) * ps]))
        self.touch(self.prefixes(ids))

    @rule(
        patterns=st.lists(st.integers(0, NUM_PATTERNS - 1), max_size=6),
        tail=st.lists(st.integers(0, NUM_PATTERNS), max_size=15),
        lock=st.booleans(),
    )
    def match(self, patterns: list[int], tail: list[int], lock: bool) -> None:
        ids = self.tokens(patterns) + tuple(tail[: self.page_size - 1])  # tail: a partial page
        self.match_ids(ids, lock)

    def match_ids(self, ids: tuple[int, ...], lock: bool) -> None:
        matched = self.model_match(ids)
        result = self.cache.match_prefix(list(ids))
        assert result.cached_len == len(matched) * self.page_size
        expected_slots = [s for prefix in matched for s in self.pages[prefix]]
        assert result.indices.dtype == torch.int64
        assert result.indices.tolist() == expected_slots
        self.touch(matched)
        if lock:
            self.cache.lock(result.handle)
            self.locks.append((result.handle, ids[: result.cached_len]))

    @rule(data=st.data())
    def lock_cached(self, data: st.DataObject) -> None:
        """Match and lock a whole cached sequence: random queries rarely hit long ones."""
        if self.pages:
            self.match_ids(data.draw(st.sampled_from(sorted(self.leaves()))), lock=True)

    @rule(data=st.data(), lock=st.booleans())
    def match_inside_locked(self, data: st.DataObject, lock: bool) -> None:
        """Match part of a locked prefix, so the split lands inside a locked node."""
        ps = self.page_size
        candidates = [locked for _, locked in self.locks if len(locked) >= 2 * ps]
        if not candidates:
            return
        locked = data.draw(st.sampled_from(candidates))
        cut = data.draw(st.integers(1, len(locked) // ps - 1)) * ps
        self.match_ids(locked[:cut] + (NUM_PATTERNS + 1,), lock)

    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        if not self.locks:
            return
        handle, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.unlock(handle)

    @rule(pages=st.integers(0, 4), extra=st.integers(0, 15))
    def evict(self, pages: int, extra: int) -> None:
        num_tokens = pages * self.page_size + extra % self.page_size  # often less than the tree
        protected = self.protected()
        evictable_before = (len(self.pages) - len(protected)) * self.page_size
        freed = self.cache.evict(num_tokens).tolist()
        assert len(freed) == len(set(freed))
        assert len(freed) >= min(num_tokens, evictable_before)
        by_slots = {slots: prefix for prefix, slots in self.pages.items()}
        ps = self.page_size
        evicted = [by_slots[tuple(freed[i : i + ps])] for i in range(0, len(freed), ps)]
        assert not set(evicted) & protected, "evicted a locked prefix"
        for prefix in evicted:
            del self.pages[prefix]
        assert all(p[:-ps] in self.pages for p in self.pages if len(p) > ps), "left a hole"
        if len(freed) < num_tokens:
            assert len(self.pages) == len(protected), "stopped while evictable data remained"
        if evicted:  # least recently used first: nothing kept is older than what went
            newest_evicted = max(self.touched[p] for p in evicted)
            kept_candidates = self.leaves() - protected
            assert all(self.touched[p] >= newest_evicted for p in kept_candidates)

    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.pages.clear()
        self.locks.clear()

    # -- checked after every step --------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        self.cache.check_integrity()
        protected = len(self.protected()) * self.page_size
        total = len(self.pages) * self.page_size
        assert self.cache.size_info == (total - protected, protected)
        cached = sorted(self.cache.cached_slots().tolist())
        assert cached == sorted(s for slots in self.pages.values() for s in slots)


@pytest.mark.fast_cases("1", "16")  # one token a page, and several
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_radix_cache_matches_reference_model(page_size: int) -> None:
    machine = type(f"RadixMachinePage{page_size}", (RadixMachine,), {"page_size": page_size})
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()
