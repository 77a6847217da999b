"""Admission and chunked prefill: which requests get how many prompt tokens in the next batch."""
from __future__ import annotations

import os
from collections import deque
from typing import TYPE_CHECKING

from radixserve.core.request import Req
from radixserve.utils.tensor import to_device

if TYPE_CHECKING:
    from radixserve.core.table import TableManager
    from radixserve.lora.manager import LoRAManager
    from radixserve.scheduler.cache_manager import CacheManager


class PrefillAdder:
    """Fills one prefill batch of at most `budget` tokens: first the request whose prompt is
    mid-chunk, then waiting requests while their whole reservation fits.

    Admission policy: arrival order, with bounded overtaking. When the oldest waiting request does
    not fit (its prompt + max_tokens reservation exceeds the free KV), one of the next `LOOKAHEAD`
    requests that fits may go first, so a small request is not starved behind huge ones; the
    oldest may be overtaken at most `MAX_OVERTAKES` times, after which nothing passes it until it
    fits, so a huge request is not starved either.

    Shared prefixes: a request whose prompt shares at least `WAIT_FOR_PREFIX` more tokens with a
    request still being prefilled than the prefix cache holds waits (like one that does not fit)
    until that prefill has put its KV in the cache (`Scheduler._share_prompt`), instead of
    computing the same prefix beside it: 64 requests arriving at once with one system prompt
    compute it once, not once per admission batch (SGLang's in-batch prefix caching)."""

    LOOKAHEAD = 8
    MAX_OVERTAKES = 32
    WAIT_FOR_PREFIX = 32  # tokens (and at least a page)

    def __init__(self, cache: CacheManager, table: TableManager, max_running: int,
                 lora: LoRAManager | None = None) -> None:
        self.cache, self.table, self.max_running, self.lora = cache, table, max_running, lora
        self.prefix_hit_tokens = 0
        self._head: Req | None = None  # the oldest waiting request, and how often it was passed
        self._overtakes = 0

    def schedule(self, running: list[Req], waiting: deque[Req], budget: int) -> list[tuple[Req, int]]:
        items: list[tuple[Req, int]] = []
        owners: list[Req] = []  # prompt KV still being computed: what a waiting one may wait for
        for req in running:
            if not req.prefill_done:
                owners.append(req)
                if budget > 0:
                    n = min(req.remaining_prefill, budget)
                    items.append((req, n))
                    budget -= n
        i = 0
        while budget > 0 and i < len(waiting) and len(running) < self.max_running and self.table.num_free:
            if waiting[0] is not self._head:
                self._head, self._overtakes = waiting[0], 0
            if i > 0 and self._overtakes >= self.MAX_OVERTAKES:
                break
            req = waiting[i]
            if not self._admit(req, owners):
                if i >= self.LOOKAHEAD:
                    break
                i += 1
                continue
            del waiting[i]
            if i > 0:
                self._overtakes += 1
            running.append(req)
            owners.append(req)
            n = min(req.remaining_prefill, budget)
            items.append((req, n))
            budget -= n
        return items

    def _waits_for_prefix(self, req: Req, ids: list[int], cached_len: int,
                          owners: list[Req]) -> bool:
        need = max(self.WAIT_FOR_PREFIX, self.cache.page_size)
        # the first-token test is cheap, and most prompts differ at once
        return any(owner.input_ids[0] == ids[0] and owner.namespace == req.namespace
                   and len(os.path.commonprefix([ids, owner.input_ids])) - cached_len >= need
                   for owner in owners)

    def _admit(self, req: Req, owners: list[Req]) -> bool:
        # the last prompt token is always computed; with prompt logprobs, every one of them
        ids = req.input_ids[:-1] if req.params.prompt_logprobs is None else []
        match = self.cache.match(ids, req.namespace)
        if ids and owners and self.cache.shares_prefixes and self._waits_for_prefix(
                req, ids, match.cached_len, owners):
            return False
        lora_slot = -1
        if req.lora is not None:
            assert self.lora is not None, "an adapter's request admitted without LoRA on"
            if (lora_slot := self.lora.acquire(req.lora, req.namespace)) is None:
                return False
        self.cache.lock(match.handle)  # before allocating: eviction must not take our prefix
        slots = self.cache.allocate(req.reserve_len - match.cached_len)
        if slots is None:
            self.cache.unlock(match.handle)
            if lora_slot >= 0:
                self.lora.release(lora_slot)
            return False
        req.row = self.table.alloc_row()
        req.lora_slot = lora_slot
        if self.lora is not None:
            self.lora.pool.row_slots[req.row] = lora_slot
        req.cache_handle, req.cached_len, req.kv_len = match.handle, match.cached_len, match.cached_len
        req.num_slots = match.cached_len + len(slots)
        pt, row = self.table.page_table, req.row
        pt[row, : match.cached_len] = match.indices.to(pt.device, pt.dtype)
        pt[row, match.cached_len : req.num_slots] = slots.to(pt.device, pt.dtype)
        self.table.token_pool[row, : req.prompt_len] = to_device(req.input_ids, pt.device)
        req.prefix_hit = match.cached_len
        self.prefix_hit_tokens += match.cached_len
        return True
