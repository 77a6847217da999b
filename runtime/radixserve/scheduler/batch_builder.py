"""Turn (request, new-token count) pairs into a device `Batch`: all indices are gathered on the
device from the page table and token pool, so no token id crosses to the host, and the host sends
one small index array per batch (two for prefill)."""
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
    if decode:  # one token per request: its row and position are the per-request lists
        idx = to_device([rows, starts, seq, ext], device)
        tok_rows_t, pos_t, per_req = idx[0], idx[1], idx
    else:
        tok_rows = [row for row, n in zip(rows, ext) for _ in range(n)]
        positions = [p for s, n in zip(starts, ext) for p in range(s, s + n)]
        tok = to_device([tok_rows, positions], device)
        tok_rows_t, pos_t = tok[0], tok[1]
        per_req = to_device([rows, starts, seq, ext], device)
    return Batch(
        phase="decode" if decode else "prefill",
        input_ids=table.token_pool[tok_rows_t, pos_t],
        positions=pos_t,
        out_loc=table.page_table[tok_rows_t, pos_t].long(),
        req_rows=per_req[0],
        seq_lens=per_req[2].int(),
        extend_lens=per_req[3].int(),
        seq_lens_cpu=seq,
        extend_lens_cpu=ext,
    )
