"""CacheManager as the scheduler drives it: match + lock, allocate, compute, cache_req."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.kvcache import SizeInfo
from radixserve.scheduler.cache_manager import CacheManager


class Req:
    """What the scheduler keeps per request: its page-table row and the match it started from."""

    def __init__(self, cm: CacheManager, prompt: list[int], max_new: int) -> None:
        self.prompt = prompt
        self.match = cm.match(prompt[:-1])
        cm.lock(self.match.handle)
        own = cm.allocate(len(prompt) + max_new - self.match.cached_len)
        if own is None:
            cm.unlock(self.match.handle)
        self.admitted = own is not None
        self.row = torch.cat([self.match.indices, own]) if own is not None else None

    @property
    def cached_len(self) -> int:
        return self.match.cached_len

    def finish(self, cm: CacheManager, computed: list[int]) -> None:
        cm.cache_req(computed, self.row, self.cached_len, self.match.handle)


def check(cm: CacheManager) -> None:
    cm.check_integrity()
    info = cm.size_info
    assert cm.num_free_pages * cm.page_size + info.evictable + info.protected + cm.held_tokens == (
        cm.num_pages * cm.page_size
    )


def test_two_requests_share_a_prefix() -> None:
    cm = CacheManager(num_pages=16, page_size=4, cache="radix", device="cpu")
    system = list(range(100, 108))  # two pages
    a = Req(cm, system + [1, 2, 3], max_new=4)
    assert a.cached_len == 0 and a.row.numel() == 16
    a.finish(cm, system + [1, 2, 3, 50, 51])  # 13 tokens computed: 12 cached, 1 freed
    check(cm)
    assert cm.size_info == SizeInfo(evictable=12, protected=0) and cm.held_tokens == 0
    assert cm.num_used_pages == 3
    b = Req(cm, system + [1, 2, 9, 9], max_new=1)
    assert b.cached_len == 8 and torch.equal(b.row[:8], a.row[:8])
    assert cm.size_info == SizeInfo(evictable=4, protected=8)
    check(cm)
    b.finish(cm, system + [1, 2, 9, 9])
    check(cm)
    assert cm.held_tokens == 0 and cm.size_info.protected == 0


def test_duplicate_insert_frees_the_duplicates() -> None:
    cm = CacheManager(num_pages=8, page_size=2, cache="radix", device="cpu")
    prompt = [5, 6, 7, 8, 9]
    a, b = Req(cm, prompt, max_new=1), Req(cm, prompt, max_new=1)  # neither sees the other
    assert a.cached_len == b.cached_len == 0 and cm.num_free_pages == 2
    a.finish(cm, prompt)  # caches [5..8] (two pages), frees its last page
    assert cm.num_free_pages == 3
    b.finish(cm, prompt)  # [5..8] already cached: b's two pages are duplicates
    assert cm.num_free_pages == 6 and cm.size_info == SizeInfo(evictable=4, protected=0)
    assert sorted(cm.cache.cached_slots().tolist()) == sorted(a.row[:4].tolist())
    check(cm)


def test_allocation_evicts_on_demand() -> None:
    cm = CacheManager(num_pages=4, page_size=2, cache="radix", device="cpu")
    Req(cm, [1, 2, 3, 4, 5], max_new=1).finish(cm, [1, 2, 3, 4, 5])
    Req(cm, [7, 7, 7], max_new=1).finish(cm, [7, 7, 7])
    assert cm.num_free_pages == 1 and cm.size_info.evictable == 6
    assert cm.available_tokens == 8
    slots = cm.allocate(5)  # three pages: two must come from the cache, least recent first
    assert slots is not None and slots.numel() == 6
    assert cm.match([1, 2, 3, 4]).cached_len == 0 and cm.match([7, 7]).cached_len == 2
    check(cm)
    cm.free(slots)
    check(cm)


def test_failed_allocation_changes_nothing() -> None:
    cm = CacheManager(num_pages=4, page_size=2, cache="radix", device="cpu")
    Req(cm, [1, 2, 3, 4, 5], max_new=1).finish(cm, [1, 2, 3, 4, 5])
    held = Req(cm, [1, 2, 3, 4, 6], max_new=1)  # locks [1..4], holds one page
    before = (cm.num_free_pages, cm.size_info, sorted(cm.cache.cached_slots().tolist()))
    assert cm.available_tokens == 2
    assert cm.allocate(3) is None
    after = (cm.num_free_pages, cm.size_info, sorted(cm.cache.cached_slots().tolist()))
    assert before == after
    assert cm.allocate(2) is not None
    check(cm)
    held.finish(cm, [1, 2, 3, 4, 6])
    check(cm)


def test_naive_cache_frees_every_own_slot() -> None:
    cm = CacheManager(num_pages=8, page_size=2, cache="naive", device="cpu")
    r = Req(cm, [1, 2, 3, 4, 5], max_new=3)
    assert r.cached_len == 0 and cm.num_free_pages == 4
    r.finish(cm, [1, 2, 3, 4, 5, 6, 7])
    assert cm.num_free_pages == 8 and cm.held_tokens == 0
    check(cm)


def test_cache_req_twice_is_caught() -> None:
    cm = CacheManager(num_pages=8, page_size=1, cache="radix", device="cpu")
    r = Req(cm, [1, 2, 3], max_new=1)
    r.finish(cm, [1, 2, 3])
    with pytest.raises(AssertionError):
        r.finish(cm, [1, 2, 3])  # e.g. an abort racing a finish


@settings(max_examples=30, deadline=None)
@given(
    page_size=st.sampled_from([1, 4]),
    cache=st.sampled_from(["radix", "naive"]),
    ops=st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(0, 2), min_size=1, max_size=4),
                  st.integers(0, 5), st.integers(-1, 4)),
        max_size=30,
    ),
)
def test_random_request_lifecycles_keep_kv_consistent(
    page_size: int, cache: str, ops: list[tuple[bool, list[int], int, int]]
) -> None:
    """Each slot records which token prefix its KV was computed for; every match must hand back
    slots holding exactly the prompt's prefix, and allocation must never hand out a live slot."""
    cm = CacheManager(num_pages=12, page_size=page_size, cache=cache, device="cpu")
    kv_of: dict[int, tuple[int, ...]] = {}  # slot -> token prefix whose last token it holds
    running: list[tuple[Req, int]] = []

    def compute(row: torch.Tensor, tokens: list[int], start: int) -> None:
        for pos in range(start, len(tokens)):
            kv_of[int(row[pos])] = tuple(tokens[: pos + 1])

    def finish(req: Req, generated: int) -> None:
        # generated == -1: aborted before its prefill ran, only the matched KV exists.
        out = [40 + i for i in range(max(generated, 0))]
        computed = (req.prompt + out)[:-1] if generated > 0 else req.prompt[: req.cached_len]
        if generated >= 0:
            compute(req.row, computed, req.cached_len)
        req.finish(cm, computed)

    for start_new, pattern, tail, new_or_generated in ops:
        if start_new or not running:
            prompt = [t for p in pattern for t in [9] * (page_size - 1) + [p]] + [77] * tail
            if not prompt:
                continue
            max_new = max(new_or_generated, 1)
            live = {int(s) for r, _ in running for s in r.row[r.cached_len :]}
            req = Req(cm, prompt, max_new)
            for pos, slot in enumerate(req.match.indices.tolist()):
                assert kv_of[slot] == tuple(prompt[: pos + 1]), "match returned foreign KV"
            if req.admitted:
                own = set(req.row[req.cached_len :].tolist())
                assert not own & live and not own & set(cm.cache.cached_slots().tolist())
                running.append((req, max_new))
        else:
            req, max_new = running.pop(0)
            finish(req, min(new_or_generated, max_new))
        check(cm)
    for req, max_new in running:
        finish(req, max_new)
    check(cm)
    assert cm.held_tokens == 0 and cm.size_info.protected == 0  # the scheduler's idle state
    assert cm.available_tokens == cm.num_pages * page_size
