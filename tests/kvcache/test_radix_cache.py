"""Hand-written radix cache scenarios: splits, LRU order, locking, and the registry."""
from __future__ import annotations

import pytest
import torch

from radixserve.kvcache import (
    PREFIX_CACHES,
    NaivePrefixCache,
    RadixPrefixCache,
    SizeInfo,
    create_prefix_cache,
)


def slots(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def page_slots(first_page: int, num_pages: int, page_size: int) -> torch.Tensor:
    return torch.arange(first_page * page_size, (first_page + num_pages) * page_size)


def test_match_is_page_aligned_and_splits_a_node() -> None:
    cache = RadixPrefixCache(4, "cpu")
    assert cache.insert_prefix(list(range(1, 9)), page_slots(0, 2, 4)) == 0
    # Diverges inside the second page: only the first page counts.
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 99, 99])
    assert m.cached_len == 4 and m.indices.tolist() == [0, 1, 2, 3]
    cache.check_integrity()
    assert cache.match_prefix(list(range(1, 12))).indices.tolist() == list(range(8))
    assert cache.match_prefix([1, 2, 3]).cached_len == 0  # less than a page
    assert cache.match_prefix([2, 2, 3, 4]).cached_len == 0
    assert cache.size_info == SizeInfo(evictable=8, protected=0)


def test_insert_reports_the_already_cached_prefix_and_keeps_the_old_slots() -> None:
    cache = RadixPrefixCache(2, "cpu")
    assert cache.insert_prefix([1, 2, 3, 4], slots(10, 11, 12, 13)) == 0
    assert cache.insert_prefix([1, 2, 3, 4, 5, 6], slots(0, 1, 2, 3, 4, 5)) == 4
    assert cache.insert_prefix([1, 2, 7, 8], slots(6, 7, 8, 9)) == 2
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).indices.tolist() == [10, 11, 12, 13, 4, 5]
    assert cache.match_prefix([1, 2, 7, 8]).indices.tolist() == [10, 11, 8, 9]
    assert sorted(cache.cached_slots().tolist()) == [4, 5, 8, 9, 10, 11, 12, 13]
    cache.check_integrity()
    with pytest.raises(AssertionError, match="page-aligned"):
        cache.insert_prefix([1, 2, 3], slots(0, 1, 2))


def test_eviction_takes_the_least_recently_used_leaf_first() -> None:
    cache = RadixPrefixCache(1, "cpu")
    cache.insert_prefix([1, 1], slots(0, 1))
    cache.insert_prefix([2, 2], slots(2, 3))
    cache.insert_prefix([3, 3], slots(4, 5))
    cache.match_prefix([1, 1, 9])  # [1, 1] is now the most recent
    assert sorted(cache.evict(1).tolist()) == [2, 3]  # a whole node goes, even if more than asked
    assert sorted(cache.evict(2).tolist()) == [4, 5]
    assert cache.match_prefix([1, 1]).cached_len == 2
    cache.check_integrity()


def test_eviction_takes_leaves_before_their_parents() -> None:
    cache = RadixPrefixCache(2, "cpu")
    cache.insert_prefix([1, 1], slots(0, 1))
    cache.insert_prefix([1, 1, 2, 2], slots(0, 1, 2, 3))
    cache.match_prefix([1, 1])  # the parent is fresher, but its child must go first anyway
    assert cache.evict(2).tolist() == [2, 3]
    assert cache.evict(2).tolist() == [0, 1]
    assert cache.evict(2).numel() == 0 and cache.size_info == SizeInfo(0, 0)


def test_locked_prefix_survives_eviction_until_unlocked() -> None:
    cache = RadixPrefixCache(1, "cpu")
    cache.insert_prefix([1, 2, 3], slots(0, 1, 2))
    cache.insert_prefix([1, 5], slots(0, 3))
    m = cache.match_prefix([1, 2, 3, 4])
    cache.lock(m.handle)
    assert cache.size_info == SizeInfo(evictable=1, protected=3)
    assert cache.evict(100).tolist() == [3]  # only the unlocked branch [5]
    assert cache.size_info == SizeInfo(evictable=0, protected=3)
    cache.unlock(m.handle)
    assert cache.size_info == SizeInfo(evictable=3, protected=0)
    assert sorted(cache.evict(100).tolist()) == [0, 1, 2]
    cache.check_integrity()


def test_splitting_a_locked_node_keeps_the_lock_whole() -> None:
    cache = RadixPrefixCache(1, "cpu")
    cache.insert_prefix([1, 2, 3, 4], slots(0, 1, 2, 3))
    long = cache.match_prefix([1, 2, 3, 4])
    cache.lock(long.handle)
    short = cache.match_prefix([1, 2, 9])  # splits the locked node after two tokens
    cache.lock(short.handle)
    cache.check_integrity()
    cache.unlock(long.handle)
    assert cache.size_info == SizeInfo(evictable=2, protected=2)
    assert sorted(cache.evict(100).tolist()) == [2, 3]
    cache.unlock(short.handle)
    assert sorted(cache.evict(100).tolist()) == [0, 1]
    cache.check_integrity()


def test_unlock_without_lock_is_caught() -> None:
    cache = RadixPrefixCache(1, "cpu")
    cache.insert_prefix([1], slots(0))
    m = cache.match_prefix([1])
    with pytest.raises(AssertionError):
        cache.unlock(m.handle)


def test_empty_match_handle_can_be_locked() -> None:
    cache = RadixPrefixCache(4, "cpu")
    m = cache.match_prefix([1, 2])
    assert m.cached_len == 0 and m.indices.numel() == 0 and m.indices.dtype == torch.int64
    cache.lock(m.handle)
    cache.check_integrity()
    cache.unlock(m.handle)


def test_reset_forgets_everything() -> None:
    cache = RadixPrefixCache(1, "cpu")
    cache.insert_prefix([1, 2], slots(0, 1))
    cache.reset()
    assert cache.size_info == SizeInfo(0, 0) and cache.cached_slots().numel() == 0
    assert cache.match_prefix([1, 2]).cached_len == 0
    cache.check_integrity()


def test_naive_cache_caches_nothing() -> None:
    cache = NaivePrefixCache(4, "cpu")
    assert cache.insert_prefix([1, 2, 3, 4], page_slots(0, 1, 4)) == 4
    m = cache.match_prefix([1, 2, 3, 4, 5])
    assert m.cached_len == 0 and m.indices.numel() == 0
    cache.lock(m.handle)
    cache.unlock(m.handle)
    assert cache.evict(8).numel() == 0
    assert cache.size_info == SizeInfo(0, 0)


def test_registry() -> None:
    assert PREFIX_CACHES.names() == ["naive", "radix"]
    assert isinstance(create_prefix_cache("radix", 4, "cpu"), RadixPrefixCache)
    assert isinstance(create_prefix_cache("naive", 4, "cpu"), NaivePrefixCache)
    with pytest.raises(ValueError, match="naive, radix"):
        create_prefix_cache("lru", 4, "cpu")
    with pytest.raises(ValueError, match="page_size"):
        create_prefix_cache("radix", 0, "cpu")


def test_dfs_order_groups_shared_prefixes_heaviest_first() -> None:
    cache = RadixPrefixCache(1, "cpu")
    slots = iter(range(100))
    for seq in ([1, 2, 3], [1, 2, 4], [5, 6]):
        cache.insert_prefix(seq, torch.tensor([next(slots) for _ in seq]))
    queries = [[9], [5, 6, 0], [1, 2, 3, 0], [1, 2, 4, 0], [1, 2, 0], [5, 6, 1]]
    handles = [cache.match_prefix(q).handle for q in queries]
    # the [1, 2] subtree holds three requests, [5, 6] two; unmatched ones last
    assert cache.dfs_order(handles) == [2, 3, 4, 1, 5, 0]
