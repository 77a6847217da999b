from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.attn_block import softmax_step
from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit
def decode_split_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, seq_ptr, order_ptr, mid_o_ptr, mid_lse_ptr, out_ptr,
    q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, table_s0, mo_s0, mo_s1, mo_s2, ml_s0, ml_s1, o_s0, o_s1,
    scale, v_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    F16_DOTS: tl.constexpr, HAS_ORDER: tl.constexpr, PDL: tl.constexpr,
):
    """One (request, KV head, split): all GROUP query heads of that KV head against one slice of
    the request's keys; writes the slice's normalised output and log-sum-exp (with one split,
    the final output directly). `scale` includes an FP8 cache's K scale; `v_scale` multiplies
    the output (1.0 for other caches). F16_DOTS: q and the probabilities in float16, into which
    an FP8 cache widens in one instruction where bf16 takes several (float16 also holds q's bf16
    mantissa exactly).

    Two choices from the H200 (sm90 compiles and sweeps): the next block's page-table slots load
    one iteration ahead, so no K/V address waits on a load of its own iteration and Triton's
    pipeliner can buffer K/V `num_stages` deep (it could not: single-buffered); and head_dim is
    taken in two halves (BLOCK_D >= 32) for both dots, which halves the widened tiles' registers
    (FP8, 128-key blocks: 255 -> 144 a thread). FP8 batch 256: 242 -> 217 µs."""
    pdl_enter(PDL)
    HALF: tl.constexpr = BLOCK_D // 2
    b, kvh, split, row, start, end, heads, gm, d, dm0, dm1, q0, q1 = split_start(
        q_ptr, rows_ptr, seq_ptr, order_ptr, q_s0, q_s1, GROUP, HEAD_DIM, NUM_SPLITS, BLOCK_G, HALF,
        BLOCK_N, F16_DOTS, HAS_ORDER)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc0 = tl.zeros([BLOCK_G, HALF], tl.float32)
    acc1 = tl.zeros([BLOCK_G, HALF], tl.float32)
    table = table_ptr + row * table_s0
    offs = start + tl.arange(0, BLOCK_N)
    next_slots = tl.load(table + offs, mask=offs < end, other=0).to(tl.int64)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        nm = offs < end
        slots = next_slots
        next_slots = tl.load(table + offs + BLOCK_N, mask=offs + BLOCK_N < end, other=0).to(tl.int64)
        kp = k_ptr + slots[:, None] * k_s0 + kvh * k_s1 + d[None, :]
        k0 = tl.load(kp, mask=nm[:, None] & dm0[None, :], other=0.0).to(q0.dtype)
        s = tl.dot(q0, tl.trans(k0), input_precision=PRECISION)
        k1 = tl.load(kp + HALF, mask=nm[:, None] & dm1[None, :], other=0.0).to(q0.dtype)
        s = tl.dot(q1, tl.trans(k1), s, input_precision=PRECISION) * scale
        s = tl.where(nm[None, :], s, float("-inf"))
        m_i, alpha, p, l_i = softmax_step(s, m_i, l_i, 1)
        p = p.to(q0.dtype)
        vp = v_ptr + slots[:, None] * v_s0 + kvh * v_s1 + d[None, :]
        v0 = tl.load(vp, mask=nm[:, None] & dm0[None, :], other=0.0).to(q0.dtype)
        acc0 = acc0 * alpha[:, None] + tl.dot(p, v0, input_precision=PRECISION)
        v1 = tl.load(vp + HALF, mask=nm[:, None] & dm1[None, :], other=0.0).to(q0.dtype)
        acc1 = acc1 * alpha[:, None] + tl.dot(p, v1, input_precision=PRECISION)
    write_split(acc0, acc1, m_i, l_i, v_scale, b, split, heads, gm, d, dm0, dm1, out_ptr, o_s0,
                o_s1, mid_o_ptr, mo_s0, mo_s1, mo_s2, mid_lse_ptr, ml_s0, ml_s1, NUM_SPLITS, HALF)


@triton.jit
def split_start(
    q_ptr, rows_ptr, seq_ptr, order_ptr, q_s0, q_s1, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr,
    F16_DOTS: tl.constexpr, HAS_ORDER: tl.constexpr,
):
    """A split's start, shared by the split and sliced kernels: its request `b`, KV head, split
    index, page-table row and key range [start, end), then its query heads (`heads`, in range
    where `gm`), the head_dim offsets of a half (`d`, in range where `dm0`/`dm1`) and the two
    halves of q, in float16 where F16_DOTS. The grid is (KV head, split, rank): the GPU starts
    programs in that linear order, so one request's programs start together, and with HAS_ORDER
    the rank-th request is `order[rank]` (the launcher's longest-first order)."""
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    rank = tl.program_id(2).to(tl.int64)
    if HAS_ORDER:
        b = tl.load(order_ptr + rank).to(tl.int64)
    else:
        b = rank
    seq_len = tl.load(seq_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HALF)
    heads = kvh * GROUP + g
    gm = g < GROUP
    dm0 = d < HEAD_DIM
    dm1 = d + HALF < HEAD_DIM
    qp = q_ptr + b * q_s0 + heads[:, None] * q_s1 + d[None, :]
    q0 = tl.load(qp, mask=gm[:, None] & dm0[None, :], other=0.0)
    q1 = tl.load(qp + HALF, mask=gm[:, None] & dm1[None, :], other=0.0)
    if F16_DOTS:
        q0 = q0.to(tl.float16)
        q1 = q1.to(tl.float16)
    return b, kvh, split, row, start, end, heads, gm, d, dm0, dm1, q0, q1


@triton.jit
def write_split(
    acc0, acc1, m_i, l_i, v_scale, b, split, heads, gm, d, dm0, dm1, out_ptr, o_s0, o_s1,
    mid_o_ptr, mo_s0, mo_s1, mo_s2, mid_lse_ptr, ml_s0, ml_s1,
    NUM_SPLITS: tl.constexpr, HALF: tl.constexpr,
):
    """A split's end, shared by the split and sliced kernels: normalise the two head_dim halves
    of the output (`acc0`, `acc1`, sum `l_i`, max `m_i`) and write them, to `out` when there is
    one split, else with their log-sum-exp for the merge kernel."""
    has = l_i > 0
    inv = (v_scale / tl.where(has, l_i, 1.0))[:, None]
    m0, m1 = gm[:, None] & dm0[None, :], gm[:, None] & dm1[None, :]
    if NUM_SPLITS == 1:
        op = out_ptr + b * o_s0 + heads[:, None] * o_s1 + d[None, :]
        tl.store(op, (acc0 * inv).to(out_ptr.dtype.element_ty), mask=m0)
        tl.store(op + HALF, (acc1 * inv).to(out_ptr.dtype.element_ty), mask=m1)
    else:
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        mp = mid_o_ptr + b * mo_s0 + heads[:, None] * mo_s1 + split * mo_s2 + d[None, :]
        tl.store(mp, acc0 * inv, mask=m0)
        tl.store(mp + HALF, acc1 * inv, mask=m1)
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
