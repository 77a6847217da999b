"""Turn (request, new-token count) pairs into a device `Batch`: all indices are gathered on the
device from the page table and token pool, so no token id crosses to the host."""
from __future__ import annotations

import torch

from radixserve.engine.batch import Batch
from radixserve.scheduler.req import Req
from radixserve.scheduler.table import TableManager
from radixserve.utils.tensor import to_device


def build_batch(
    items: list[tuple[Req, int]], table: TableManager, device: torch.device, decode: bool
) -> Batch:
    rows = [r.row for r, _ in items]
    starts = [r.kv_len for r, _ in items]
    ext = [n for _, n in items]
    seq = [s + n for s, n in zip(starts, ext)]
    if decode:
        tok_rows, positions = rows, starts
    else:
        tok_rows = [row for row, n in zip(rows, ext) for _ in range(n)]
        positions = [p for s, n in zip(starts, ext) for p in range(s, s + n)]
    tok_rows_t = to_device(tok_rows, device)
    pos_t = to_device(positions, device)
    lens = to_device([rows, seq, ext], device)
    return Batch(
        phase="decode" if decode else "prefill",
        input_ids=table.token_pool[tok_rows_t, pos_t],
        positions=pos_t,
        out_loc=table.page_table[tok_rows_t, pos_t].long(),
        req_rows=lens[0],
        seq_lens=lens[1].int(),
        extend_lens=lens[2].int(),
        seq_lens_cpu=seq,
        extend_lens_cpu=ext,
    )
