"""The prefix-cache contract shared by the radix and naive caches, and their registry."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch

from radixserve.utils.registry import Registry


class MatchResult(NamedTuple):
    handle: Any  # opaque: pass back to lock/unlock
    cached_len: int  # a multiple of page_size: the tokens whose KV is on the device
    indices: torch.Tensor  # [cached_len] int64 KV slots of the matched tokens
    host_len: int = 0  # more matched tokens after those, held only by the host tier (hiradix)


class SizeInfo(NamedTuple):
    evictable: int  # cached tokens no request holds: eviction may take them
    protected: int  # cached tokens some locked match covers

    @property
    def total(self) -> int:
        return self.evictable + self.protected


class BasePrefixCache(ABC):
    """Maps page-aligned token sequences to the KV slots that hold their keys and values."""

    def __init__(self, page_size: int, device: torch.device | str) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.device = torch.device(device)

    def empty_indices(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    @abstractmethod
    def match_prefix(self, input_ids: list[int], namespace: int = 0) -> MatchResult:
        """The longest cached prefix of `input_ids` in `namespace` (0: the base model's; each
        LoRA adapter has its own: KV is never shared across namespaces), cut down to whole pages.

        Refreshes the LRU time of everything matched. The handle stays valid only while locked:
        call `lock` before anything can evict."""

    @abstractmethod
    def lock(self, handle: Any) -> None:
        """Take one reference on every node from the handle's up to the root: while held, the
        matched prefix cannot be evicted."""

    @abstractmethod
    def unlock(self, handle: Any) -> None:
        """Drop a reference taken by `lock(handle)`."""

    @abstractmethod
    def insert_prefix(self, input_ids: list[int], indices: torch.Tensor, namespace: int = 0) -> int:
        """Cache a page-aligned sequence whose KV lives at `indices` (same length) in `namespace`.

        Returns how many leading tokens were already cached (page-aligned); their slots stay the
        cache's own, so the caller frees its duplicates for those positions. The rest of
        `indices` now belongs to the cache."""

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Drop unreferenced leaves, least recently used first, until at least `num_tokens` are
        freed or nothing evictable remains. Returns the freed slots (whole pages)."""

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo:
        """Evictable and protected token counts."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything (the caller reclaims the slots)."""

    @abstractmethod
    def cached_slots(self) -> torch.Tensor:
        """Every slot the cache owns (any order), for integrity checks and tests."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError describing the first broken invariant, if any."""


PREFIX_CACHES: Registry[type[BasePrefixCache]] = Registry("prefix cache")


def create_prefix_cache(name: str, page_size: int, device: torch.device | str) -> BasePrefixCache:
    # NOTE: the package's `__init__` imports every implementation (which registers it) before
    # anyone can reach this module, so the registry is full without importing them back here.
    return PREFIX_CACHES.get(name)(page_size, device)
