"""`build_batch` turns (request, new tokens) pairs into the device batch: every token's id, position
and KV slot come from the request's own row of the token pool and page table, at the positions
after the KV it already has. Checked here against the same lookups written out token by token."""
from __future__ import annotations

import random

import pytest
import torch

from radixserve.core.request import Req
from radixserve.core.table import TableManager
from radixserve.engine.batch_builder import build_batch
from radixserve.sampling_params import SamplingParams


def _table(rows: int, cols: int) -> TableManager:
    table = TableManager(rows, cols, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    table.token_pool.copy_(torch.randint(0, 50_000, table.token_pool.shape, generator=gen))
    table.page_table.copy_(torch.randperm(rows * cols, generator=gen).view(rows, cols).int())
    return table


def _items(specs: list[tuple[int, int, int]]) -> list[tuple[Req, int]]:
    """(row, tokens already in the KV, new tokens) per request."""
    items = []
    for i, (row, done, new) in enumerate(specs):
        req = Req(i, [1] * (done + new + 5), SamplingParams(), row=row, kv_len=done)
        items.append((req, new))
    return items


@pytest.mark.parametrize("decode", [False, True])
def test_each_token_reads_its_own_row_after_the_kv_it_has(decode: bool) -> None:
    rng = random.Random(1 + decode)
    table = _table(12, 300)
    rows = rng.sample(range(12), 9)
    specs = [(row, rng.randint(0, 150), 1 if decode else rng.randint(1, 120)) for row in rows]
    if not decode:
        specs[3] = (specs[3][0], 0, 1)  # a one-token prompt, and one starting at position 0
        specs[5] = (specs[5][0], 0, 77)
    batch = build_batch(_items(specs), table, torch.device("cpu"), decode)

    want_rows = [row for row, _, new in specs for _ in range(new)]
    want_pos = [p for _, done, new in specs for p in range(done, done + new)]
    assert batch.positions.tolist() == want_pos
    assert batch.input_ids.tolist() == [table.token_pool[r, p].item() for r, p in zip(want_rows, want_pos)]
    assert batch.out_loc.tolist() == [table.page_table[r, p].item() for r, p in zip(want_rows, want_pos)]
    assert batch.req_rows.tolist() == rows
    assert batch.seq_lens.tolist() == batch.seq_lens_cpu == [d + n for _, d, n in specs]
    assert batch.extend_lens.tolist() == batch.extend_lens_cpu == [n for _, _, n in specs]
    assert batch.out_loc.dtype == torch.int64 and batch.seq_lens.dtype == torch.int32
