from __future__ import annotations

import pytest
import torch

from radixserve.kvcache import PageAllocator


def test_alloc_free_roundtrip_and_exhaustion() -> None:
    alloc = PageAllocator(num_pages=5, page_size=2, device="cpu")
    a = alloc.alloc(3)
    b = alloc.alloc(2)
    assert a.dtype == torch.int64 and alloc.num_free == 0
    assert sorted(a.tolist() + b.tolist()) == [0, 1, 2, 3, 4]
    assert alloc.alloc(1) is None and alloc.num_free == 0  # failure allocates nothing
    alloc.free(a)
    assert alloc.num_free == 3
    assert sorted(alloc.alloc(3).tolist()) == sorted(a.tolist())
    assert alloc.alloc(0).numel() == 0
    alloc.check_integrity()


def test_allocated_pages_are_not_aliased_by_later_frees() -> None:
    alloc = PageAllocator(num_pages=4, page_size=1, device="cpu")
    a = alloc.alloc(2)
    kept = a.tolist()
    alloc.free(torch.tensor([a[0].item()]))
    alloc.free(torch.tensor([a[1].item()]))
    alloc.alloc(2)
    assert a.tolist() == kept


def test_pages_to_slots_and_back() -> None:
    alloc = PageAllocator(num_pages=8, page_size=4, device="cpu")
    slots = alloc.pages_to_slots(torch.tensor([3, 0, 5]))
    assert slots.tolist() == [12, 13, 14, 15, 0, 1, 2, 3, 20, 21, 22, 23]
    assert alloc.slots_to_pages(slots).tolist() == [3, 0, 5]
    assert alloc.slots_to_pages(slots.to(torch.int32)).tolist() == [3, 0, 5]


@pytest.mark.parametrize("slots", [[0, 1, 2], [1, 2, 3, 4], [0, 1, 3, 2]])
def test_slots_to_pages_rejects_partial_or_scrambled_pages(slots: list[int]) -> None:
    alloc = PageAllocator(num_pages=8, page_size=4, device="cpu")
    with pytest.raises(AssertionError):
        alloc.slots_to_pages(torch.tensor(slots))


def test_double_free_is_detected() -> None:
    alloc = PageAllocator(num_pages=4, page_size=1, device="cpu")
    page = alloc.alloc(1)
    alloc.free(page)
    with pytest.raises(AssertionError, match="double free"):
        alloc.free(torch.cat([page, page, page, page]))
    taken = alloc.alloc(2).tolist()
    still_free = next(p for p in range(4) if p not in taken)
    alloc.free(torch.tensor([still_free]))  # fits by count, but the page is already free
    with pytest.raises(AssertionError, match="twice"):
        alloc.check_integrity()


def test_large_requests_are_cheap() -> None:
    alloc = PageAllocator(num_pages=200_000, page_size=16, device="cpu")
    pages = alloc.alloc(150_000)
    assert alloc.pages_to_slots(pages).numel() == 150_000 * 16
    alloc.free(pages)
    assert alloc.num_free == 200_000
    alloc.check_integrity()


def test_bad_sizes_raise_value_error() -> None:
    with pytest.raises(ValueError, match="num_pages"):
        PageAllocator(0, 1, "cpu")
    with pytest.raises(ValueError, match="page_size"):
        PageAllocator(1, 0, "cpu")
