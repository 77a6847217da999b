from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.attn_block import attend_block
from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit
def decode_split_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, seq_ptr, mid_o_ptr, mid_lse_ptr, out_ptr,
    q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, table_s0, mo_s0, mo_s1, mo_s2, ml_s0, ml_s1, o_s0, o_s1,
    scale, v_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    F16_DOTS: tl.constexpr, PDL: tl.constexpr,
):
    """One (request, KV head, split): all GROUP query heads of that KV head against one slice of
    the request's keys; writes the slice's normalised output and log-sum-exp (with one split,
    the final output directly). `scale` includes an FP8 cache's K scale; `v_scale` multiplies
    the output (1.0 for other caches). F16_DOTS: q and the probabilities in float16, into which
    an FP8 cache widens in one instruction where bf16 takes several (float16 also holds q's bf16
    mantissa exactly)."""
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + g
    gm = g < GROUP
    dm = d < HEAD_DIM
    q = tl.load(q_ptr + b * q_s0 + heads[:, None] * q_s1 + d[None, :],
                mask=gm[:, None] & dm[None, :], other=0.0)
    if F16_DOTS:
        q = q.to(tl.float16)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        nm = offs < end
        m_i, l_i, acc = attend_block(
            q, m_i, l_i, acc, k_ptr, v_ptr, table_ptr, row, table_s0, k_s0, k_s1, v_s0, v_s1, kvh,
            offs, nm, nm[None, :], d, dm, scale, PRECISION,
        )
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None] * v_scale
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * o_s0 + heads[:, None] * o_s1 + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=gm[:, None] & dm[None, :])
        return
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(mid_o_ptr + b * mo_s0 + heads[:, None] * mo_s1 + split * mo_s2 + d[None, :], out,
             mask=gm[:, None] & dm[None, :])
    tl.store(mid_lse_ptr + b * ml_s0 + heads * ml_s1 + split, lse, mask=gm)


@triton.jit
def decode_merge_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr,
    mo_s0, mo_s1, mo_s2, ml_s0, ml_s1, o_s0, o_s1,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    sm = s < NUM_SPLITS
    dm = d < HEAD_DIM
    lse = tl.load(mid_lse_ptr + b * ml_s0 + h * ml_s1 + s, mask=sm, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m)
    o = tl.load(mid_o_ptr + b * mo_s0 + h * mo_s1 + s[:, None] * mo_s2 + d[None, :],
                mask=sm[:, None] & dm[None, :], other=0.0)
    total = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * o_s0 + h * o_s1 + d, res.to(out_ptr.dtype.element_ty), mask=dm)
