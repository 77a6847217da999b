"""Paged KV storage, page allocation and the prefix caches (radix, naive) behind one interface."""
from __future__ import annotations

from radixserve.kvcache.allocator import PageAllocator
from radixserve.kvcache.base import (
    PREFIX_CACHES,
    BasePrefixCache,
    MatchResult,
    SizeInfo,
    create_prefix_cache,
)
from radixserve.kvcache.naive import NaivePrefixCache
from radixserve.kvcache.pool import MHAKVPool
from radixserve.kvcache.radix import RadixPrefixCache
from radixserve.kvcache.sizing import kv_bytes_per_token

__all__ = [
    "PREFIX_CACHES",
    "BasePrefixCache",
    "MHAKVPool",
    "MatchResult",
    "NaivePrefixCache",
    "PageAllocator",
    "RadixPrefixCache",
    "SizeInfo",
    "create_prefix_cache",
    "kv_bytes_per_token",
]
