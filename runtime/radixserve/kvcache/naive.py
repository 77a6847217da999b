"""A prefix cache that caches nothing: every request computes its whole prompt (ablation)."""
from __future__ import annotations

from typing import Any

import torch

from radixserve.kvcache.base import PREFIX_CACHES, BasePrefixCache, MatchResult, SizeInfo


@PREFIX_CACHES.register("naive")
class NaivePrefixCache(BasePrefixCache):
    def match_prefix(self, input_ids: list[int], namespace: int = 0) -> MatchResult:
        return MatchResult(None, 0, self.empty_indices())

    def lock(self, handle: Any) -> None:
        assert handle is None, "naive cache handles are None"

    def unlock(self, handle: Any) -> None:
        assert handle is None, "naive cache handles are None"

    def insert_prefix(self, input_ids: list[int], indices: torch.Tensor, namespace: int = 0) -> int:
        # Claiming it is all cached already makes the caller free every slot it passed in.
        return len(input_ids)

    def evict(self, num_tokens: int) -> torch.Tensor:
        return self.empty_indices()

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable=0, protected=0)

    def reset(self) -> None:
        pass

    def cached_slots(self) -> torch.Tensor:
        return self.empty_indices()

    def check_integrity(self) -> None:
        pass  # holds no state
