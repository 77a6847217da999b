"""Free-page bookkeeping for the KV pool, kept on the pool's device so the scheduler never syncs."""
from __future__ import annotations

import torch


class PageAllocator:
    """A stack of free page ids: `alloc`/`free` are a slice and a slice-assign, O(pages moved).

    Pages free are `_stack[:_num_free]`; the host knows the count without reading the device.
    """

    def __init__(self, num_pages: int, page_size: int, device: torch.device | str) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = torch.device(device)
        self._offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        self.reset()
        # CUDA loads a kernel at its first launch in a process: the division's first launch cost
        # 15 ms of a prefill step on the H200 (docs/benchmarks.md). Pay it now, not mid-serving.
        self.slots_to_pages(self.pages_to_slots(self._stack[:1]))

    def reset(self) -> None:
        # Descending, so that popping from the top hands out low page ids first.
        self._stack = torch.arange(
            self.num_pages - 1, -1, -1, dtype=torch.int64, device=self.device
        )
        self._num_free = self.num_pages

    @property
    def num_free(self) -> int:
        return self._num_free

    def alloc(self, num_pages: int) -> torch.Tensor | None:
        """`num_pages` page ids, or None (allocating nothing) when fewer are free."""
        assert num_pages >= 0, num_pages
        if num_pages > self._num_free:
            return None
        top = self._num_free
        self._num_free = top - num_pages
        return self._stack[self._num_free : top].flip(0)  # flip copies: later frees overwrite

    def free(self, pages: torch.Tensor) -> None:
        n = pages.numel()
        assert self._num_free + n <= self.num_pages, (
            f"freeing {n} pages with {self._num_free}/{self.num_pages} already free: double free"
        )
        self._stack[self._num_free : self._num_free + n] = pages.reshape(-1)
        self._num_free += n

    def pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        """Each page expands to its `page_size` slots, in order."""
        return (pages.to(torch.int64).unsqueeze(1) * self.page_size + self._offsets).reshape(-1)

    def slots_to_pages(self, slots: torch.Tensor) -> torch.Tensor:
        """Inverse of `pages_to_slots`; `slots` must be whole pages."""
        assert slots.numel() % self.page_size == 0, (
            f"{slots.numel()} slots is not a whole number of pages of {self.page_size}"
        )
        rows = slots.to(torch.int64).reshape(-1, self.page_size)
        pages = rows[:, 0] // self.page_size
        # NOTE: checking contents would force a host sync on the GPU; CPU runs (CI) check them.
        if rows.device.type == "cpu" and self.page_size > 1:
            assert torch.equal(rows, pages.unsqueeze(1) * self.page_size + self._offsets.cpu()), (
                "slots are not whole, in-order pages"
            )
        return pages

    def free_pages(self) -> torch.Tensor:
        """The free page ids (a copy), for integrity checks."""
        return self._stack[: self._num_free].clone()

    def check_integrity(self) -> None:
        free = self._stack[: self._num_free].cpu()
        if free.numel() and not (0 <= int(free.min()) and int(free.max()) < self.num_pages):
            raise AssertionError(f"free list holds a page outside [0, {self.num_pages})")
        if torch.unique(free).numel() != free.numel():
            raise AssertionError("free list holds a page twice (double free)")
