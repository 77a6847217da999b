from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def argmax_chunk_kernel(x_ptr, val_ptr, idx_ptr, n_cols, s_row, n_chunks,
                        BLOCK: tl.constexpr):
    # program (row, chunk): the chunk's largest value and its first column, a NaN counted as
    # +inf (torch.argmax takes NaN as the largest)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * s_row + cols, mask=cols < n_cols, other=float("-inf"))
    x = x.to(tl.float32)
    x = tl.where(x != x, float("inf"), x)  # noqa: PLR0124 (only NaN differs from itself)
    best, at = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(val_ptr + row * n_chunks + chunk, best)
    tl.store(idx_ptr + row * n_chunks + chunk, chunk * BLOCK + at)


@triton.jit
def argmax_merge_kernel(val_ptr, idx_ptr, out_ptr, n_chunks, pool_ptr, rows_ptr, cols_ptr, s_pool,
                        cap, BLOCK: tl.constexpr, STORE: tl.constexpr):
    # the row's chunks in order: the first chunk holding the largest value has its first column;
    # STORE: the pick is also the next step's input token, at pool[rows[row], min(cols[row], cap)]
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    vals = tl.load(val_ptr + row * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
    _, at = tl.max(vals, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tok = tl.load(idx_ptr + row * n_chunks + at).to(tl.int64)
    tl.store(out_ptr + row, tok)
    if STORE:
        col = tl.minimum(tl.load(cols_ptr + row).to(tl.int64), cap)
        tl.store(pool_ptr + tl.load(rows_ptr + row).to(tl.int64) * s_pool + col, tok)
