"""Break one invariant at a time by hand and make sure `check_integrity` notices."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from radixserve.kvcache import RadixPrefixCache
from radixserve.kvcache.radix import RadixNode
from radixserve.scheduler.cache_manager import CacheManager


def build_tree() -> tuple[RadixPrefixCache, dict[str, RadixNode]]:
    """root -> [1,1] -> {[2,2,3,3] (locked), [4,4]} with page size 2."""
    cache = RadixPrefixCache(2, "cpu")
    cache.insert_prefix([1, 1, 2, 2, 3, 3], torch.arange(0, 6))
    cache.insert_prefix([1, 1, 4, 4], torch.tensor([0, 1, 6, 7]))
    locked = cache.match_prefix([1, 1, 2, 2, 3, 3])
    cache.lock(locked.handle)
    shared = locked.handle.parent
    nodes = {"shared": shared, "locked": locked.handle, "free": shared.children[(4, 4)]}
    cache.check_integrity()
    return cache, nodes


def _retime(n: dict[str, RadixNode]) -> None:
    n["free"].last_access = n["shared"].last_access + 1


def _scramble_page(n: dict[str, RadixNode]) -> None:
    n["free"].indices = torch.tensor([7, 6])


def _misfile(c: RadixPrefixCache, n: dict[str, RadixNode]) -> None:
    n["shared"].children[(5, 5)] = n["shared"].children.pop((4, 4))


RADIX_MUTATIONS: dict[str, Callable[[RadixPrefixCache, dict[str, RadixNode]], object]] = {
    "ref count": lambda c, n: setattr(n["shared"], "ref", n["shared"].ref + 1),
    "lock count": lambda c, n: setattr(n["locked"], "locks", 0),
    "child ref above parent": lambda c, n: setattr(n["free"], "ref", 1),
    "evictable size": lambda c, n: setattr(c, "_evictable", c._evictable + 2),
    "protected size": lambda c, n: setattr(c, "_protected", c._protected - 2),
    "duplicate slot": lambda c, n: setattr(n["free"], "indices", torch.tensor([2, 3])),
    "negative slot": lambda c, n: setattr(n["free"], "indices", torch.tensor([-2, -1])),
    "scrambled page": lambda c, n: _scramble_page(n),
    "key not page multiple": lambda c, n: setattr(n["free"], "key", (4, 4, 4)),
    "slots shorter than key": lambda c, n: setattr(n["locked"], "indices", torch.tensor([2, 3])),
    "child under wrong key": _misfile,
    "broken parent pointer": lambda c, n: setattr(n["free"], "parent", n["locked"]),
    "lost eviction candidate": lambda c, n: c._leaves.clear(),
    "child fresher than parent": lambda c, n: _retime(n),
}


@pytest.mark.parametrize("name", list(RADIX_MUTATIONS))
def test_radix_integrity_check_catches(name: str) -> None:
    cache, nodes = build_tree()
    RADIX_MUTATIONS[name](cache, nodes)
    with pytest.raises(AssertionError, match="radix cache integrity"):
        cache.check_integrity()


def build_manager() -> CacheManager:
    cm = CacheManager(num_pages=6, page_size=2, cache="radix", device="cpu")
    slots = cm.allocate(6)
    m = cm.match([])
    cm.lock(m.handle)
    cm.cache_req([1, 2, 3, 4, 5], slots, 0, m.handle)  # caches two pages, frees the third
    cm.check_integrity()
    return cm


def test_manager_catches_lost_tokens() -> None:
    cm = build_manager()
    cm._held += 2  # as if a request's pages vanished from the books
    with pytest.raises(AssertionError, match="accounting"):
        cm.check_integrity()


def test_manager_catches_a_slot_both_free_and_cached() -> None:
    cm = build_manager()
    cached_page = cm.cache.cached_slots()[:2]
    held = cm.allocate(2)  # takes a free page, so the books still balance after the bad free
    cm.allocator.free(cm.allocator.slots_to_pages(cached_page))
    cm._held -= held.numel()
    with pytest.raises(AssertionError, match="both free and in the prefix cache"):
        cm.check_integrity()


def test_manager_catches_a_cached_slot_out_of_range() -> None:
    cm = build_manager()
    cm.cache.insert_prefix([9, 9], torch.tensor([100, 101]))
    cm._held -= 2
    with pytest.raises(AssertionError, match="outside"):
        cm.check_integrity()


def test_manager_catches_a_double_free_in_the_allocator() -> None:
    cm = build_manager()
    held = cm.allocate(2)
    free_page = cm.allocator.free_pages()[:1]
    cm.allocator.free(free_page)
    cm._held -= held.numel()
    with pytest.raises(AssertionError, match="twice"):
        cm.check_integrity()
