from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.attn_block import attend_block


@triton.jit(do_not_specialize=["window"])  # one compile for any window, 1 too
def extend_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, rows_ptr, seq_ptr, ext_ptr, qo_start_ptr,
    q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, o_s0, o_s1, table_s0,
    scale, v_scale, window,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):
    """One (block of a request's new tokens, query head). New token i of a request sits at
    absolute position prefix + i and sees keys 0 .. prefix + i, all read through the page table
    (the new tokens' own K/V are already stored). `scale` includes an FP8 cache's K scale;
    `v_scale` multiplies the output (1.0 for other caches).

    `window` W > 0 (a sliding-window layer; 0: none): a query at position p sees only keys
    p-W+1..p, and the key loop starts at the block holding the first key the block's first query
    sees, so a long prompt costs O(W) keys a query block, not its whole prefix. Every real query
    keeps at least its own key; a padding row past the request may see none (zeros, never
    stored)."""
    mblk = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    ext = tl.load(ext_ptr + b)
    if mblk * BLOCK_M >= ext:
        return
    seq_len = tl.load(seq_ptr + b)
    prefix = seq_len - ext
    row = tl.load(rows_ptr + b).to(tl.int64)
    q_start = tl.load(qo_start_ptr + b).to(tl.int64)
    kvh = h // GROUP

    m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    mm = m < ext
    dm = d < HEAD_DIM
    q = tl.load(q_ptr + (q_start + m)[:, None] * q_s0 + h * q_s1 + d[None, :],
                mask=mm[:, None] & dm[None, :], other=0.0)
    q_pos = prefix + m
    end = tl.minimum(seq_len, prefix + (mblk + 1) * BLOCK_M)

    # a window's first key for the block's first query, rounded down to a whole key block
    lo = tl.where(window > 0, tl.maximum(prefix + mblk * BLOCK_M - window + 1, 0), 0)
    lo = lo // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(lo, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        nm = offs < end
        keep = nm[None, :] & (offs[None, :] <= q_pos[:, None])
        keep = keep & ((offs[None, :] > q_pos[:, None] - window) | (window == 0))
        m_i, l_i, acc = attend_block(
            q, m_i, l_i, acc, k_ptr, v_ptr, table_ptr, row, table_s0, k_s0, k_s1, v_s0, v_s1, kvh,
            offs, nm, keep, d, dm, scale, PRECISION,
        )
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * v_scale
    tl.store(o_ptr + (q_start + m)[:, None] * o_s0 + h * o_s1 + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=mm[:, None] & dm[None, :])
