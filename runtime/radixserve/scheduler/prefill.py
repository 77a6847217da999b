"""Admission and chunked prefill: which requests get how many prompt tokens in the next batch."""
from __future__ import annotations

import os
from collections import deque
from typing import TYPE_CHECKING

from radixserve.core.request import Req
from radixserve.scheduler.policy import SchedulePolicy, match_ids
from radixserve.utils.tensor import to_device

if TYPE_CHECKING:
    from radixserve.core.table import TableManager
    from radixserve.lora.manager import LoRAManager
    from radixserve.scheduler.cache_manager import CacheManager
    from radixserve.scheduler.token_estimate import TokenEstimate


class PrefillAdder:
    """Fills one prefill batch of at most `budget` tokens: first the request whose prompt is
    mid-chunk, then waiting requests while their KV fits.

    What must fit (`--kv-admission`): `reserve` allocates prompt + max_tokens at admission, so
    decoding never runs out of KV. `optimistic` (SGLang's) allocates the prompt only and admits
    while the free and evictable KV covers it, the request's own tokens to come (clipped) and the
    running requests' expected ones (`token_estimate.py`); a decode step that then finds no page
    retracts requests (`Scheduler`), which come back at the head of the queue.

    Order: the policy's (`policy.py`; arrival order under fcfs), with bounded overtaking. When the
    first request does not fit, one of the next `LOOKAHEAD` requests that fits may go first, so a
    small request is not starved behind huge ones; the first may be overtaken at most
    `MAX_OVERTAKES` times, after which nothing passes it until it fits, so a huge request is not
    starved either.

    Shared prefixes: a request whose prompt shares at least `WAIT_FOR_PREFIX` more tokens with a
    request still being prefilled than the prefix cache holds waits (like one that does not fit)
    until that prefill has put its KV in the cache (`Scheduler._share_prompt`), instead of
    computing the same prefix beside it: 64 requests arriving at once with one system prompt
    compute it once, not once per admission batch (SGLang's in-batch prefix caching)."""

    LOOKAHEAD = 8
    MAX_OVERTAKES = 32
    WAIT_FOR_PREFIX = 32  # tokens (and at least a page)

    def __init__(self, cache: CacheManager, table: TableManager, max_running: int,
                 policy: SchedulePolicy, estimate: TokenEstimate | None,
                 lora: LoRAManager | None = None) -> None:
        """`estimate`: optimistic admission's (None: reserve prompt + max_tokens)."""
        self.cache, self.table, self.max_running, self.lora = cache, table, max_running, lora
        self.policy, self.estimate = policy, estimate
        self.prefix_hit_tokens = 0
        self.retracted_recomputed = 0  # KV a retracted request had computed and computes again
        self._head: Req | None = None  # the first waiting request, and how often it was passed
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
        if not (budget > 0 and waiting and len(running) < self.max_running and self.table.num_free):
            return items
        order = self.policy.order(waiting)
        # the running requests' tokens to come, expected; those admitted now count whole
        promised = self.estimate.expected(running) if self.estimate is not None else 0.0
        i = 0
        while budget > 0 and i < len(order) and len(running) < self.max_running and self.table.num_free:
            if order[0] is not self._head:
                self._head, self._overtakes = order[0], 0
            if i > 0 and self._overtakes >= self.MAX_OVERTAKES:
                break
            req = order[i]
            if not self._admit(req, owners, promised):
                if i >= self.LOOKAHEAD:
                    break
                i += 1
                continue
            del order[i]
            waiting.remove(req)
            self.policy.admitted(req, waiting)
            if i > 0:
                self._overtakes += 1
            if self.estimate is not None:
                promised += self.estimate.upper(req)
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
                   and len(os.path.commonprefix([ids, owner.fill_ids])) - cached_len >= need
                   for owner in owners)

    def _fits(self, req: Req, need: int, promised: float) -> bool:
        """Optimistic admission: its `need` tokens of KV now and its tokens to come fit beside
        what the running requests are expected to write (always, under `reserve`: `allocate`
        decides)."""
        if self.estimate is None:
            return True
        ps = self.cache.page_size
        pages = -(-need // ps) * ps
        return pages + self.estimate.upper(req) + promised <= self.cache.available_tokens

    def _admit(self, req: Req, owners: list[Req], promised: float) -> bool:
        # the last token to prefill is always computed; with prompt logprobs, every one of them
        ids = match_ids(req)
        match = self.cache.match(ids, req.namespace)
        hit = match.cached_len + match.host_len
        if ids and owners and self.cache.shares_prefixes and self._waits_for_prefix(
                req, ids, hit, owners):
            return False
        lora_slot = -1
        if req.lora is not None:
            assert self.lora is not None, "an adapter's request admitted without LoRA on"
            if (lora_slot := self.lora.acquire(req.lora, req.namespace)) is None:
                return False
        self.cache.lock(match.handle)  # before allocating: eviction must not take our prefix
        # slots for the host tier's part of the match, then for what the request computes
        need = (req.prefill_len if self.estimate is not None else req.reserve_len) - match.cached_len
        slots = self.cache.allocate(need) if self._fits(req, need, promised) else None
        if slots is None:
            self.cache.unlock(match.handle)
            if lora_slot >= 0:
                self.lora.release(lora_slot)
            return False
        if match.host_len:
            loaded = match.host_len
            match = self.cache.load(match, slots[:loaded])
            slots = slots[loaded:]
        req.row = self.table.alloc_row()
        req.lora_slot = lora_slot
        if self.lora is not None:
            self.lora.pool.row_slots[req.row] = lora_slot
        req.cache_handle, req.cached_len, req.kv_len = match.handle, match.cached_len, match.cached_len
        req.num_slots = match.cached_len + len(slots)
        pt, row = self.table.page_table, req.row
        pt[row, : match.cached_len] = match.indices.to(pt.device, pt.dtype)
        pt[row, match.cached_len : req.num_slots] = slots.to(pt.device, pt.dtype)
        self.table.token_pool[row, : req.prefill_len] = to_device(req.fill_ids, pt.device)
        if not req.output_ids:  # (a retracted request keeps its first admission's figure)
            req.prefix_hit = match.cached_len
        self.prefix_hit_tokens += match.cached_len
        if req.retracted_kv:
            self.retracted_recomputed += max(0, req.retracted_kv - match.cached_len)
            req.retracted_kv = 0
        return True
