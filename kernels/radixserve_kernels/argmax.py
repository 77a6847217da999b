"""Greedy decoding's pick: each row's first column holding its largest value, as
`torch.argmax(x, -1)` (a NaN counted as +inf). On the H200 torch's reduction read
256 x 151,936 bf16 logits in 54 µs (1.44 TB/s), a decode step's sampling; split into chunks
across the GPU and merged per row, the same read takes 28 µs (docs/benchmarks.md).

A `TokenStore` also writes each pick where the next step reads its input token, in the merge
launch: three launches fewer a decode step than torch's cast, clamp and indexed store."""
from __future__ import annotations

from typing import NamedTuple

import torch

from radixserve_kernels._utils import cdiv, next_pow2

ARGMAX_CHUNK = 4096  # columns a program reads: Qwen's 151,936 make 38 chunks a row


class TokenStore(NamedTuple):
    """Row i's token also goes to `pool[rows[i], min(cols[i], cap)]` (a request that rides past
    its last column under overlap writes its last one: its token is discarded anyway)."""
    pool: torch.Tensor  # [R, L] int64, last dim contiguous: the token ids of each table row
    rows: torch.Tensor  # [rows] int64
    cols: torch.Tensor  # [rows] int32 or int64
    cap: int


def store_tokens_ref(tokens: torch.Tensor, store: TokenStore) -> None:
    """`TokenStore`'s write in torch: tokens [rows] int64."""
    store.pool[store.rows, store.cols.long().clamp(max=store.cap)] = tokens


def argmax_rows_ref(x: torch.Tensor, store: TokenStore | None = None) -> torch.Tensor:
    out = x.argmax(-1)
    if store is not None:
        store_tokens_ref(out, store)
    return out


def argmax_rows(x: torch.Tensor, store: TokenStore | None = None,
                chunk: int = ARGMAX_CHUNK) -> torch.Tensor:
    """Triton twin of `argmax_rows_ref` for x [rows, cols] (rows may be strided, last dim
    contiguous): int64 [rows]. Two launches, no host sync."""
    from radixserve_kernels._jit.argmax import argmax_chunk_kernel, argmax_merge_kernel

    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax_rows takes [rows, cols > 0], got {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if not rows:
        return out
    if store is not None and (store.pool.stride(-1) != 1 or store.rows.shape[0] != rows
                              or store.cols.shape[0] != rows):
        raise ValueError(f"argmax_rows: a TokenStore of {store.rows.shape[0]} rows and "
                         f"{store.cols.shape[0]} columns (pool stride {store.pool.stride(-1)}) "
                         f"for {rows} rows")
    n_chunks = cdiv(cols, chunk)
    vals = torch.empty(rows, n_chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, n_chunks, dtype=torch.int32, device=x.device)
    argmax_chunk_kernel[(rows, n_chunks)](x, vals, idx, cols, x.stride(0), n_chunks, BLOCK=chunk,
                                          num_warps=4)
    pool, srows, scols, cap = store if store is not None else (out, out, out, 0)
    argmax_merge_kernel[(rows,)](vals, idx, out, n_chunks, pool, srows, scols, pool.stride(0), cap,
                                 BLOCK=max(16, next_pow2(n_chunks)), STORE=store is not None,
                                 num_warps=1)
    return out
