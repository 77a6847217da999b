from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def page_indices_kernel(
    table_ptr, rows_ptr, seq_ptr, indptr_ptr, out_ptr, table_s0,
    PAGE: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + b).to(tl.int64)
    n_pages = tl.cdiv(tl.load(seq_ptr + b), PAGE)
    start = tl.load(indptr_ptr + b).to(tl.int64)
    for p0 in range(0, n_pages, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        m = p < n_pages
        slot = tl.load(table_ptr + row * table_s0 + p * PAGE, mask=m, other=0)
        tl.store(out_ptr + start + p, slot // PAGE, mask=m)
