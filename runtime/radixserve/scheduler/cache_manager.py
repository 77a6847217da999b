"""The one object the scheduler asks for KV slots: page allocation, prefix matching, eviction on
demand, and handing a finished request's KV to the prefix cache.

Every device slot is in exactly one of four states, and `check_integrity` checks they add up:
free (in the allocator), evictable or protected (in the prefix cache), or held by a request
(allocated and not yet freed or given to the cache).

With the host tier (`--enable-hierarchical-cache`) the prefix cache is `HiRadixPrefixCache`: a
match may end in KV only the host holds, which `load` brings back into slots the caller
allocated (they pass from held to the cache); the copies the tree decides are handed to the
`HostTier`: backups an eviction needs at once (`allocate`), the loads a forward reads before it
(`before_launch`) and the other backups behind it (`after_launch`). The host tier's own
accounting (free + held by the tree == its size) is the tree's `check_integrity`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from radixserve.kvcache.allocator import PageAllocator
from radixserve.kvcache.base import MatchResult, SizeInfo, create_prefix_cache
from radixserve.kvcache.hiradix import HiRadixPrefixCache

if TYPE_CHECKING:
    from radixserve.scheduler.host_tier import HostTier, LayerEvents


class CacheManager:
    def __init__(
        self, num_pages: int, page_size: int, cache: str, device: torch.device | str,
        tier: HostTier | None = None, write_back: bool = False,
    ) -> None:
        """`tier`: the host tier's copies (its pool sizes the tree's host side)."""
        self.page_size = page_size
        self.allocator = PageAllocator(num_pages, page_size, device)
        self.tier = tier
        self.cache = (create_prefix_cache(cache, page_size, device) if tier is None else
                      HiRadixPrefixCache(page_size, device, tier.host_pool.num_pages, write_back))
        self.shares_prefixes = cache != "naive"  # the naive cache keeps nothing for others
        self._held = 0  # tokens: allocated minus freed minus given to the cache
        self.host_hit_tokens = 0  # matched tokens loaded back from the host tier

    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free

    @property
    def num_used_pages(self) -> int:
        return self.num_pages - self.num_free_pages

    @property
    def held_tokens(self) -> int:
        return self._held

    @property
    def size_info(self) -> SizeInfo:
        return self.cache.size_info

    @property
    def available_tokens(self) -> int:
        """What admission may reserve: free pages plus what eviction could free."""
        return self.num_free_pages * self.page_size + self.cache.size_info.evictable

    def match(self, input_ids: list[int], namespace: int = 0) -> MatchResult:
        return self.cache.match_prefix(input_ids, namespace)

    def dfs_order(self, handles: list[Any]) -> list[int]:
        """`handles` in the radix tree's weighted depth-first order (`RadixPrefixCache`)."""
        return self.cache.dfs_order(handles)

    def lock(self, handle: Any) -> None:
        self.cache.lock(handle)

    def unlock(self, handle: Any) -> None:
        self.cache.unlock(handle)

    def allocate(self, num_tokens: int) -> torch.Tensor | None:
        """Slots of `ceil(num_tokens / page_size)` whole pages, evicting cached prefixes if free
        pages are short; None, changing nothing, if even full eviction cannot cover it."""
        assert num_tokens >= 0, num_tokens
        num_pages = -(-num_tokens // self.page_size)
        short = num_pages - self.allocator.num_free
        if short > 0:
            if short * self.page_size > self.cache.size_info.evictable:
                return None
            evicted = self.cache.evict(short * self.page_size)
            if self.tier is not None:
                self.tier.evicted(self.cache.take("writes"), self.cache.take("evicted_ready"))
            self.allocator.free(self.allocator.slots_to_pages(evicted))
        pages = self.allocator.alloc(num_pages)
        assert pages is not None, "eviction freed fewer pages than it reported evictable"
        self._held += num_pages * self.page_size
        return self.allocator.pages_to_slots(pages)

    def load(self, match: MatchResult, slots: torch.Tensor) -> MatchResult:
        """The locked `match` with its host part (`host_len` tokens) given the device `slots`
        the caller allocated for it (they become the cache's); its copies start before the
        next forward."""
        assert isinstance(self.cache, HiRadixPrefixCache) and len(slots) == match.host_len
        self._held -= match.host_len
        self.host_hit_tokens += match.host_len
        return self.cache.load_back(match.handle, slots)

    def before_launch(self) -> LayerEvents | None:
        """Start the loads the next forward reads (host tier): what its layers wait for."""
        return None if self.tier is None else self.tier.before_launch(self.cache.take("loads"))

    def after_launch(self) -> None:
        """Start the backups decided so far behind the forward just launched (host tier)."""
        if self.tier is not None:
            self.tier.after_launch(self.cache.take("writes"))

    @property
    def host_tokens(self) -> tuple[int, int]:
        """(tokens the host tier holds, its capacity); (0, 0) without one."""
        if not isinstance(self.cache, HiRadixPrefixCache):
            return 0, 0
        return self.cache.host_tokens, self.cache.host_slots_total

    def free(self, slots: torch.Tensor) -> None:
        """Return a request's own slots (whole pages) that never reached the prefix cache."""
        assert slots.numel() <= self._held, f"freeing {slots.numel()} slots, only {self._held} held"
        self.allocator.free(self.allocator.slots_to_pages(slots))
        self._held -= slots.numel()

    def cache_req(
        self, token_ids: list[int], slots: torch.Tensor, cached_len: int, handle: Any,
        namespace: int = 0,
    ) -> None:
        """On finish or abort: give the request's computed KV to the prefix cache and release
        the rest. `slots[:cached_len]` came from `match`; the request allocated the others."""
        ps, n_slots = self.page_size, slots.numel()
        assert cached_len % ps == 0 and n_slots % ps == 0, (cached_len, n_slots, ps)
        assert cached_len <= n_slots and len(token_ids) <= n_slots, (
            cached_len, len(token_ids), n_slots
        )
        slots = slots.to(torch.int64)
        aligned = len(token_ids) - len(token_ids) % ps
        already = (self.cache.insert_prefix(token_ids[:aligned], slots[:aligned], namespace)
                   if aligned else 0)
        # The locked match keeps token_ids[:cached_len] in the cache, so insert found it again.
        assert already >= min(cached_len, aligned), (
            f"insert found {already} cached tokens, fewer than the {cached_len} matched"
        )
        self.cache.unlock(handle)
        duplicates = slots[cached_len:already]  # cached meanwhile by another request
        tail = slots[max(aligned, cached_len) :]  # not a whole page, or never computed
        if duplicates.numel() + tail.numel():
            self.allocator.free(self.allocator.slots_to_pages(torch.cat([duplicates, tail])))
        self._held -= n_slots - cached_len  # every own slot is now free or the cache's
        assert self._held >= 0, f"held tokens went negative ({self._held}): a request cached twice?"

    def share_prefix(
        self, token_ids: list[int], slots: torch.Tensor, cached_len: int, handle: Any,
        namespace: int = 0,
    ) -> MatchResult | None:
        """Mid-prefill: put the request's computed prompt KV (its whole pages) in the prefix
        cache, so requests admitted from now on share it (SGLang's cache_unfinished_req). The
        request keeps it, locked through the returned match (None: nothing new to share): its
        page-table row takes the match's indices, since slots another request cached meanwhile
        replace the request's own copies of them, which are freed. Safe while the batch that
        computes this KV is in flight: every later batch runs after it on the same stream."""
        aligned = len(token_ids) - len(token_ids) % self.page_size
        if not self.shares_prefixes or aligned <= cached_len:
            return None
        slots = slots[:aligned].to(torch.int64)
        already = self.cache.insert_prefix(token_ids[:aligned], slots, namespace)
        assert already >= cached_len, f"insert found {already} cached tokens, {cached_len} matched"
        match = self.cache.match_prefix(token_ids[:aligned], namespace)
        assert match.cached_len == aligned, (match.cached_len, aligned)
        self.cache.lock(match.handle)
        self.cache.unlock(handle)
        if already > cached_len:
            self.allocator.free(self.allocator.slots_to_pages(slots[cached_len:already]))
        self._held -= aligned - cached_len  # own slots now freed or the cache's
        return match

    def reset(self) -> None:
        self.allocator.reset()
        self.cache.reset()
        self._held = 0

    def check_integrity(self) -> None:
        self.cache.check_integrity()
        self.allocator.check_integrity()
        free_tokens = self.num_free_pages * self.page_size
        info = self.cache.size_info
        total = free_tokens + info.evictable + info.protected + self.held_tokens
        if total != self.num_slots:
            raise AssertionError(
                f"cache manager accounting: free {free_tokens} + evictable {info.evictable} + "
                f"protected {info.protected} + held {self.held_tokens} = {total} != {self.num_slots}"
            )
        cached = self.cache.cached_slots().cpu()
        if cached.numel():
            if int(cached.min()) < 0 or int(cached.max()) >= self.num_slots:
                raise AssertionError(
                    f"cache manager: a cached slot is outside [0, {self.num_slots})"
                )
            free_slots = self.allocator.pages_to_slots(self.allocator.free_pages()).cpu()
            if torch.isin(cached, free_slots).any():
                raise AssertionError("cache manager: a slot is both free and in the prefix cache")
