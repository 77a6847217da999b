"""The radix cache with its host tier, driven as the scheduler drives it (match, lock, allocate,
load, compute, cache), with random requests that share prefixes, finish in any order and keep a
small device pool and a small host tier under pressure. Every request "computes" its KV by
writing, at each position, a value that names the whole prefix up to it (KV depends on all of
it); after every step the device and host pools must hold, at every slot the tree maps, the
value of the prefix it stands for, so a page copied to the wrong place, loaded from a stale copy
or freed while in use shows, and the tree's, the pool's and the host tier's accounting must add
up (`check_integrity`)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixserve.kvcache.host_pool import HostKVPool
from radixserve.kvcache.pool import MHAKVPool
from radixserve.scheduler.cache_manager import CacheManager
from radixserve.scheduler.host_tier import HostTier

LAYERS = 2
SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def kv_value(prefix: tuple[int, ...], layer: int, kind: int) -> float:
    """The KV of the last token of `prefix` at `layer` (kind 0: K, 1: V), exact in float32."""
    return float(hash(prefix) % 65536 + (2 * layer + kind) * 65536)


def make(page_size: int, device_pages: int, host_pages: int, write_back: bool):
    dev = MHAKVPool(LAYERS, device_pages, page_size, 1, 1, torch.float32, "cpu")
    host = HostKVPool(LAYERS, host_pages, page_size, 1, 1, torch.float32, pinned=False)
    cm = CacheManager(device_pages, page_size, "radix", "cpu", HostTier(dev, host, torch.device("cpu")),
                      write_back)
    return cm, dev, host


def write_kv(pool, slots: torch.Tensor, tokens: list[int], start: int) -> None:
    """Compute tokens[start:len(slots)]'s KV into `slots` (one row per token)."""
    for i in range(start, len(slots)):
        for layer in range(LAYERS):
            for kind, cache in enumerate((pool.k_cache(layer), pool.v_cache(layer))):
                cache[slots[i]] = kv_value(tuple(tokens[: i + 1]), layer, kind)


def assert_kv(pool, slots: torch.Tensor, tokens: list[int], where: str) -> None:
    for i, slot in enumerate(slots.tolist()):
        for layer in range(LAYERS):
            for kind, cache in enumerate((pool.k_cache(layer), pool.v_cache(layer))):
                got = float(cache[slot].reshape(-1)[0])
                assert got == kv_value(tuple(tokens[: i + 1]), layer, kind), (
                    f"{where} slot {slot}: KV of token {i} of {tokens} is wrong")


class TieredCacheMachine(RuleBasedStateMachine):
    page_size = 2
    write_back = False

    @initialize()
    def setup(self) -> None:
        self.cm, self.dev, self.host = make(self.page_size, 12, 20, self.write_back)
        self.live: list[tuple[list[int], torch.Tensor, object, int]] = []
        self.host_hits = 0

    def tokens(self, patterns: list[int], tail: int) -> list[int]:
        ps = self.page_size
        page = [t for p in patterns for t in [9] * (ps - 1) + [p]]
        return page + [7] * tail

    @rule(patterns=st.lists(st.integers(0, 2), min_size=1, max_size=6),
          tail=st.integers(0, 1), extra=st.integers(0, 3))
    def admit(self, patterns: list[int], tail: int, extra: int) -> None:
        """Match, lock, allocate the host part and the rest (plus `extra` decode tokens), load,
        check what the match hands over, compute the rest, launch."""
        cm = self.cm
        tokens = self.tokens(patterns, tail)
        match = cm.match(tokens[:-1])
        cm.lock(match.handle)
        slots = cm.allocate(len(tokens) + extra - match.cached_len)
        if slots is None:
            cm.unlock(match.handle)
            return
        if match.host_len:
            self.host_hits += match.host_len
            loaded = match.host_len
            match = cm.load(match, slots[:loaded])
            slots = slots[loaded:]
        row = torch.cat([match.indices, slots])
        cm.before_launch()  # the loads, before the forward reads them
        assert_kv(self.dev, row[: match.cached_len], tokens, "matched")
        write_kv(self.dev, row, tokens[: len(row)], match.cached_len)
        cm.after_launch()
        self.live.append((tokens, row, match.handle, match.cached_len))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        tokens, row, handle, cached = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        self.cm.cache_req(tokens, row, cached, handle)

    @invariant()
    def consistent(self) -> None:
        self.cm.check_integrity()
        tree = self.cm.cache
        # backups decided since the last launch are written at the next (or by an eviction)
        pending = {s for o in tree.writes for s in o.host.tolist()}
        for node in tree._nodes():
            path = tree._path(node)
            prefix = [t for n in path for t in n.key]
            start = len(prefix) - len(node.key)
            if node.on_device:
                assert_kv(self.dev, torch.cat([n.indices for n in path]), prefix, "device")
            if node.host is not None and not pending & set(node.host.tolist()):
                self._assert_host(node.host, prefix, start)
        assert self.cm.host_hit_tokens == self.host_hits

    def _assert_host(self, host_slots: torch.Tensor, prefix: list[int], start: int) -> None:
        for i, slot in enumerate(host_slots.tolist()):
            for layer in range(LAYERS):
                for kind, cache in enumerate((self.host.k_cache(layer), self.host.v_cache(layer))):
                    got = float(cache[slot].reshape(-1)[0])
                    want = kv_value(tuple(prefix[: start + i + 1]), layer, kind)
                    assert got == want, f"host slot {slot} holds the wrong KV"


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
@pytest.mark.parametrize("page_size,write_back", [(1, False), (2, False), (2, True), (4, True)])
def test_host_tier_keeps_kv_and_accounting(page_size: int, write_back: bool) -> None:
    machine = type(f"Tiered{page_size}{write_back}", (TieredCacheMachine,),
                   {"page_size": page_size, "write_back": write_back})
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()


def test_evicted_prefix_comes_back_from_the_host() -> None:
    cm, dev, _ = make(page_size=2, device_pages=4, host_pages=8, write_back=False)
    a = [1, 2, 3, 4, 5, 6]
    m = cm.match(a)
    cm.lock(m.handle)
    row = cm.allocate(6)
    write_kv(dev, row, a, 0)
    cm.after_launch()  # write-through: backed up behind the "forward"
    cm.cache_req(a, row, 0, m.handle)
    filler = cm.allocate(8)  # the whole device pool: a is evicted, kept by the host
    assert filler is not None and cm.size_info.total == 0 and cm.host_tokens[0] == 6
    cm.free(filler)
    again = cm.match(a + [7])
    assert (again.cached_len, again.host_len) == (0, 6)
    cm.lock(again.handle)
    loaded = cm.load(again, cm.allocate(6))
    cm.before_launch()
    assert loaded.cached_len == 6 and cm.host_hit_tokens == 6
    assert_kv(dev, loaded.indices, a, "loaded")
    cm.cache_req(a, loaded.indices, 6, loaded.handle)
    cm.check_integrity()
