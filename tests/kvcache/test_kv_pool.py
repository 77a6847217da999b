from __future__ import annotations

import pytest
import torch

from radixserve.kvcache import MHAKVPool, PageAllocator, kv_bytes_per_token


def make_pool(num_pages: int = 4, page_size: int = 4) -> MHAKVPool:
    return MHAKVPool(
        num_layers=2, num_pages=num_pages, page_size=page_size, num_kv_heads=2, head_dim=3,
        dtype=torch.float32, device="cpu",
    )


def test_buffers_have_one_scratch_page_past_the_allocatable_slots() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    assert (pool.num_slots, pool.num_pages, pool.page_size) == (16, 4, 4)
    assert pool.k_cache(1).shape == (16 + 4, 2, 3)
    assert pool.v_cache(0).shape == (20, 2, 3)
    assert pool.dummy_slot == 16


def test_dummy_slot_is_never_handed_out() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    alloc = PageAllocator(pool.num_pages, pool.page_size, "cpu")
    slots = alloc.pages_to_slots(alloc.alloc(pool.num_pages))
    assert alloc.alloc(1) is None
    assert sorted(slots.tolist()) == list(range(pool.num_slots))
    assert pool.dummy_slot not in slots.tolist()


def test_store_kv_writes_exactly_the_given_rows_of_the_given_layer() -> None:
    pool = make_pool()
    k = torch.arange(3 * 2 * 3, dtype=torch.float32).view(3, 2, 3) + 1
    v = -k
    out_loc = torch.tensor([5, 0, 16], dtype=torch.int64)  # 16: the dummy slot
    pool.store_kv(k, v, out_loc, layer_id=1)
    for row, expected in zip([5, 0, 16], range(3)):
        assert torch.equal(pool.k_cache(1)[row], k[expected])
        assert torch.equal(pool.v_cache(1)[row], v[expected])
    untouched = [r for r in range(20) if r not in (0, 5, 16)]
    assert not pool.k_cache(1)[untouched].any() and not pool.v_cache(1)[untouched].any()
    assert not pool.k_cache(0).any() and not pool.v_cache(0).any()


def test_cache_views_alias_the_storage() -> None:
    pool = make_pool()
    pool.k_cache(0)[3].fill_(2.0)
    assert bool((pool.k_cache(0)[3] == 2.0).all())
    assert not pool.v_cache(0)[3].any()


def test_sizing() -> None:
    # 2 (K and V) * 24 layers * 8 heads * 128 dims * 2 bytes
    assert kv_bytes_per_token(24, 8, 128, torch.bfloat16) == 2 * 24 * 8 * 128 * 2
    assert kv_bytes_per_token(1, 1, 1, torch.float32) == 8
    with pytest.raises(ValueError, match="head_dim"):
        kv_bytes_per_token(1, 1, 0, torch.float32)
