from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.attn_block import softmax_step
from radixserve_kernels._jit.pdl import pdl_enter
from radixserve_kernels._jit.rotary import cos_sin, norm_rotate, store_row


@triton.jit(do_not_specialize=["window"])  # one compile for any window, 1 too
def decode_split_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, seq_ptr, order_ptr, mid_o_ptr, mid_lse_ptr, out_ptr,
    q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, table_s0, mo_s0, mo_s1, mo_s2, ml_s0, ml_s1, o_s0, o_s1,
    scale, v_scale,
    kn_ptr, vn_ptr, loc_ptr, cs_ptr, qw_ptr, kw_ptr, kn_s0, kn_s1, vn_s0, vn_s1, cs_s0, eps,
    k_inv, v_inv, window,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    F16_DOTS: tl.constexpr, HAS_ORDER: tl.constexpr, PDL: tl.constexpr,
    ROPE: tl.constexpr, HAS_NORM: tl.constexpr, FP8_STORE: tl.constexpr, FP8_MAX: tl.constexpr,
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
    (FP8, 128-key blocks: 255 -> 144 a thread). FP8 batch 256: 242 -> 217 µs.

    ROPE: q and the new token's k and v (`kn_ptr`, `vn_ptr`) come as the qkv projection left
    them, and the kernel does the rotary kernel's job itself (`new_token_queries`,
    `fold_new_token`)."""
    pdl_enter(PDL)
    HALF: tl.constexpr = BLOCK_D // 2
    b, kvh, split, row, start, end, heads, gm, d, dm0, dm1, q0, q1, seq_len = split_start(
        q_ptr, rows_ptr, seq_ptr, order_ptr, q_s0, q_s1, window, GROUP, HEAD_DIM, NUM_SPLITS,
        BLOCK_G, HALF, BLOCK_N, HAS_ORDER)
    kv_end = keys_end(start, end, seq_len, ROPE)
    table = table_ptr + row * table_s0
    offs = start + tl.arange(0, BLOCK_N)
    next_slots = tl.load(table + offs, mask=offs < kv_end, other=0).to(tl.int64)
    q0, q1, nk1, nk2, nv1, nv2 = new_token_queries(
        q0, q1, b, kvh, start, end, seq_len, d, k_ptr, v_ptr, k_s0, k_s1, v_s0, v_s1,
        kn_ptr, vn_ptr, loc_ptr, cs_ptr, qw_ptr, kw_ptr, kn_s0, kn_s1, vn_s0, vn_s1, cs_s0, eps,
        k_inv, v_inv, HALF, F16_DOTS, ROPE, HAS_NORM, FP8_STORE, FP8_MAX)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc0 = tl.zeros([BLOCK_G, HALF], tl.float32)
    acc1 = tl.zeros([BLOCK_G, HALF], tl.float32)
    for n0 in range(start, kv_end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        nm = offs < kv_end
        slots = next_slots
        next_slots = tl.load(table + offs + BLOCK_N, mask=offs + BLOCK_N < kv_end,
                             other=0).to(tl.int64)
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
    m_i, l_i, acc0, acc1 = fold_new_token(m_i, l_i, acc0, acc1, q0, q1, nk1, nk2, nv1, nv2, start,
                                          end, seq_len, scale, ROPE)
    write_split(acc0, acc1, m_i, l_i, v_scale, b, split, heads, gm, d, dm0, dm1, out_ptr, o_s0,
                o_s1, mid_o_ptr, mo_s0, mo_s1, mo_s2, mid_lse_ptr, ml_s0, ml_s1, NUM_SPLITS, HALF)


@triton.jit
def split_start(
    q_ptr, rows_ptr, seq_ptr, order_ptr, q_s0, q_s1, window, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, HALF: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_ORDER: tl.constexpr,
):
    """A split's start, shared by the split and sliced kernels: its request `b`, KV head, split
    index, page-table row and key range [start, end), then its query heads (`heads`, in range
    where `gm`), the head_dim offsets of a half (`d`, in range where `dm0`/`dm1`), the two
    halves of q as stored, and the request's length. The grid is (KV head, split, rank): the GPU starts
    programs in that linear order, so one request's programs start together, and with HAS_ORDER
    the rank-th request is `order[rank]` (the launcher's longest-first order).

    The splits divide the keys the query sees: all the request's, or with a sliding `window`
    W > 0 (0: none) its last W, [seq_len - W, seq_len); a split past them is empty (its loop
    runs no block and it writes lse -inf). The last non-empty split still ends at seq_len, so
    the new-token work (`new_token_queries`, `fold_new_token`) stays with it."""
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    rank = tl.program_id(2).to(tl.int64)
    if HAS_ORDER:
        b = tl.load(order_ptr + rank).to(tl.int64)
    else:
        b = rank
    seq_len = tl.load(seq_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    lo = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
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
    return b, kvh, split, row, start, end, heads, gm, d, dm0, dm1, q0, q1, seq_len


@triton.jit
def new_token_queries(
    q0, q1, b, kvh, start, end, seq_len, d, k_ptr, v_ptr, k_s0, k_s1, v_s0, v_s1,
    kn_ptr, vn_ptr, loc_ptr, cs_ptr, qw_ptr, kw_ptr, kn_s0, kn_s1, vn_s0, vn_s1, cs_s0, eps,
    k_inv, v_inv, HALF: tl.constexpr, F16_DOTS: tl.constexpr, ROPE: tl.constexpr,
    HAS_NORM: tl.constexpr, FP8_STORE: tl.constexpr, FP8_MAX: tl.constexpr,
):
    """(q's two halves as the dots take them, in float16 where F16_DOTS; the new token's k and v
    halves as the cache holds them, in q's dot dtype, for `fold_new_token`).

    With ROPE, q, k and v come from the qkv projection, and this does the rotary kernel's work
    for the program's heads of the new token (position seq_len - 1), with the same helpers and
    roundings as `qk_norm_rope_kernel`: q and k normed (Qwen3) and rotated, and the program
    whose key range holds the token stores k and v at slot `loc[b]`. The loop never reads that
    slot, so nothing waits on the store, and all the loads here issue before the loop's, their
    latency hidden behind it (done after the loop, they cost each program a round trip: a batch
    of 256 on the H200 lost 0.13 ms a step). Needs HALF == head_dim / 2
    (`decode_rope_fusable`)."""
    k1 = tl.zeros([1, HALF], tl.float32)
    k2 = k1
    v1 = k1
    v2 = k1
    if ROPE:
        ty: tl.constexpr = q0.dtype
        dd = d[None, :]
        kp = kn_ptr + b * kn_s0 + kvh * kn_s1 + dd
        vp = vn_ptr + b * vn_s0 + kvh * vn_s1 + dd
        kr1, kr2 = tl.load(kp).to(tl.float32), tl.load(kp + HALF).to(tl.float32)
        vr1, vr2 = tl.load(vp), tl.load(vp + HALF)
        slot = tl.load(loc_ptr + b).to(tl.int64)
        cos, sin = cos_sin(cs_ptr, cs_s0, tl.maximum(seq_len - 1, 0).to(tl.int64), d, HALF, ty)
        q0, q1 = norm_rotate(q0.to(tl.float32), q1.to(tl.float32), qw_ptr, cos, sin, d, HALF, eps,
                             ty, HAS_NORM)
        kr1, kr2 = norm_rotate(kr1, kr2, kw_ptr, cos, sin, d, HALF, eps, ty, HAS_NORM)
        mine = (dd < HALF) & (start < end) & (end == seq_len)  # this program holds the token
        k1, k2 = store_row(k_ptr, slot * k_s0 + kvh * k_s1 + dd, HALF, kr1, kr2, mine, k_inv,
                           FP8_STORE, FP8_MAX)
        v1, v2 = store_row(v_ptr, slot * v_s0 + kvh * v_s1 + dd, HALF, vr1, vr2, mine, v_inv,
                           FP8_STORE, FP8_MAX)
    if F16_DOTS:
        q0 = q0.to(tl.float16)
        q1 = q1.to(tl.float16)
    dt: tl.constexpr = q0.dtype  # the keys and values widened as the loop widens the cache's
    return (q0, q1, k1.to(dt).to(tl.float32), k2.to(dt).to(tl.float32),
            v1.to(dt).to(tl.float32), v2.to(dt).to(tl.float32))


@triton.jit
def keys_end(start, end, seq_len, ROPE: tl.constexpr):
    """Where a split's loop over cached keys stops: with ROPE the new token (the last key, not in
    the cache yet) is left to `fold_new_token`."""
    if ROPE:
        end = tl.maximum(tl.minimum(end, seq_len - 1), start)
    return end


@triton.jit
def fold_new_token(m_i, l_i, acc0, acc1, q0, q1, k1, k2, v1, v2, start, end, seq_len, scale,
                   ROPE: tl.constexpr):
    """With ROPE, in the program whose key range holds the new token: fold its k and v
    (`new_token_queries`) into the online softmax (max `m_i`, sum `l_i`, output halves
    `acc0`/`acc1`) as one more key, the probabilities rounded to q's dtype as the loop's."""
    if ROPE:  # noqa: SIM102 (a compile-time branch around a runtime one)
        if (start < end) & (end == seq_len):
            s = (tl.sum(q0.to(tl.float32) * k1, 1) + tl.sum(q1.to(tl.float32) * k2, 1)) * scale
            m_new = tl.maximum(m_i, s)
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            l_i = l_i * alpha + p
            p = p.to(q0.dtype).to(tl.float32)[:, None]
            acc0 = acc0 * alpha[:, None] + p * v1
            acc1 = acc1 * alpha[:, None] + p * v2
            m_i = m_new
    return m_i, l_i, acc0, acc1


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
