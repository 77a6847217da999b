"""The host tier's copies on CPU (the same code the GPU runs on its streams): scattered device
pages to runs of host pages and back, in every KV dtype (FP8 as raw bytes), bring back the bytes
written; a copy touches no other slot."""
from __future__ import annotations

import pytest
import torch

from radixserve.kvcache.host_pool import HostKVPool
from radixserve.kvcache.kv_copy import copy_to_device, copy_to_host, host_runs
from radixserve.kvcache.kv_dtype import FP8_KV_DTYPE
from radixserve.kvcache.pool import MHAKVPool


def test_host_runs_splits_at_every_gap() -> None:
    slots = torch.tensor([4, 5, 6, 9, 10, 2, 3])
    assert host_runs(slots) == [(4, 0, 3), (9, 3, 2), (2, 5, 2)]
    assert host_runs(torch.tensor([], dtype=torch.int64)) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, FP8_KV_DTYPE])
@pytest.mark.parametrize("page_size", [1, 4])
def test_round_trip_keeps_the_bytes(dtype, page_size) -> None:
    pool = MHAKVPool(2, 16, page_size, 2, 8, dtype, "cpu")
    for layer in range(2):
        for cache in (pool.k_cache(layer), pool.v_cache(layer)):
            cache.copy_(torch.randn(cache.shape).to(dtype))
    host = HostKVPool(2, 16, page_size, 2, 8, dtype, pinned=False)
    offsets = torch.arange(page_size)

    def slots(pages: list[int]) -> torch.Tensor:
        return (torch.tensor(pages)[:, None] * page_size + offsets).reshape(-1)

    src, dst, on_host = slots([9, 2, 14, 5]), slots([0, 7, 3, 11]), slots([1, 2, 6, 7])
    before = [(pool.k_cache(i).clone(), pool.v_cache(i).clone()) for i in range(2)]
    copy_to_host(pool, host, src, on_host)
    layers: list[int] = []
    copy_to_device(host, pool, on_host, dst, layers.append)
    assert layers == [0, 1]
    untouched = torch.ones(pool.num_slots + page_size, dtype=torch.bool)
    untouched[dst] = False
    for layer, (k, v) in enumerate(before):
        for got, want in ((pool.k_cache(layer), k), (pool.v_cache(layer), v)):
            raw_got, raw_want = got.view(torch.uint8), want.view(torch.uint8)
            assert torch.equal(raw_got[dst], raw_want[src])
            assert torch.equal(raw_got[untouched], raw_want[untouched])
