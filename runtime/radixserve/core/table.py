"""Request rows: each admitted request owns one row of the page table (its KV slots, token by
token) and of the token pool (its token ids, on the device so decode inputs never leave it)."""
from __future__ import annotations

import torch

from radixserve.utils.tensor import lazy_zeros


class TableManager:
    def __init__(self, max_reqs: int, max_seq_len: int, device: torch.device) -> None:
        self.max_reqs, self.max_seq_len = max_reqs, max_seq_len
        self.page_table = lazy_zeros((max_reqs, max_seq_len), torch.int32, device)
        self.token_pool = lazy_zeros((max_reqs, max_seq_len), torch.int64, device)
        self._free = list(range(max_reqs - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc_row(self) -> int:
        return self._free.pop()

    def free_row(self, row: int) -> None:
        assert row not in self._free, f"row {row} freed twice"
        self._free.append(row)
