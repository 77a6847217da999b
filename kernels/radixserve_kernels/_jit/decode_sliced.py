from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.attn_block import softmax_step
from radixserve_kernels._jit.decode import (
    fold_new_token,
    keys_end,
    new_token_queries,
    split_start,
    write_split,
)
from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit(do_not_specialize=["window"])  # one compile for any window, 1 too
def decode_sliced_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, seq_ptr, order_ptr, mid_o_ptr, mid_lse_ptr, out_ptr,
    q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, table_s0, mo_s0, mo_s1, mo_s2, ml_s0, ml_s1, o_s0, o_s1,
    scale, v_scale,
    kn_ptr, vn_ptr, loc_ptr, cs_ptr, qw_ptr, kw_ptr, kn_s0, kn_s1, vn_s0, vn_s1, cs_s0, eps,
    k_inv, v_inv, window,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    F16_DOTS: tl.constexpr, HAS_ORDER: tl.constexpr, PDL: tl.constexpr,
    ROPE: tl.constexpr, HAS_NORM: tl.constexpr, FP8_STORE: tl.constexpr, FP8_MAX: tl.constexpr,
    SLICES: tl.constexpr, FP8_QK: tl.constexpr,
):
    """`decode_split_kernel`'s job and arguments, with each block of BLOCK_N keys cut into SLICES
    slices (launched with one warp a slice): the dots are batched over the slices, so each warp
    keeps its own online softmax and output over its slice and the loop never exchanges scores
    between warps (the split kernel's warps share one block: 9 barriers an iteration, and the
    probabilities cross shared memory). The slices merge once, at the end. On the H200 over an
    FP8 cache (q bf16, group 2): batch 256 218 -> 201 µs, 64: 86 -> 69, 16: 28 -> 24; the
    16-bit cache and one request stay faster on the split kernel.

    FP8_QK (with F16_DOTS, a bf16 q over an e4m3 cache): q is split exactly into two e4m3 parts
    (`split_q_e4m3`) and the QK dots take the keys as they are, in FP8: only V is widened, and
    batch 256 takes 185 -> 169 µs (docs/benchmarks.md). ROPE: as in the split kernel."""
    pdl_enter(PDL)
    KEYS: tl.constexpr = BLOCK_N // SLICES  # a slice's keys per block
    HALF: tl.constexpr = BLOCK_D // 2
    b, kvh, split, row, start, end, heads, gm, d, dm0, dm1, q0, q1, seq_len = split_start(
        q_ptr, rows_ptr, seq_ptr, order_ptr, q_s0, q_s1, window, GROUP, HEAD_DIM, NUM_SPLITS,
        BLOCK_G, HALF, BLOCK_N, HAS_ORDER)
    kv_end = keys_end(start, end, seq_len, ROPE)
    table = table_ptr + row * table_s0
    keys = tl.arange(0, SLICES)[:, None] * KEYS + tl.arange(0, KEYS)[None, :]  # [slice, key]
    offs = start + keys
    next_slots = tl.load(table + offs, mask=offs < kv_end, other=0).to(tl.int64)
    q0, q1, nk1, nk2, nv1, nv2 = new_token_queries(
        q0, q1, b, kvh, start, end, seq_len, d, k_ptr, v_ptr, k_s0, k_s1, v_s0, v_s1,
        kn_ptr, vn_ptr, loc_ptr, cs_ptr, qw_ptr, kw_ptr, kn_s0, kn_s1, vn_s0, vn_s1, cs_s0, eps,
        k_inv, v_inv, HALF, F16_DOTS, ROPE, HAS_NORM, FP8_STORE, FP8_MAX)
    qn0, qn1 = q0, q1  # [BLOCK_G, HALF], for the new token's dot
    if FP8_QK:  # (the scores come out scaled by qk_scale: undone with the softmax scale)
        h0, l0, h1, l1, qk_scale = split_q_e4m3(q0, q1, SLICES, BLOCK_G, HALF)
        s_scale = (scale / qk_scale)[None, :, None]
    q0 = tl.broadcast_to(q0[None, :, :], (SLICES, BLOCK_G, HALF))
    q1 = tl.broadcast_to(q1[None, :, :], (SLICES, BLOCK_G, HALF))
    m_i = tl.full([SLICES, BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([SLICES, BLOCK_G], tl.float32)
    acc0 = tl.zeros([SLICES, BLOCK_G, HALF], tl.float32)
    acc1 = tl.zeros([SLICES, BLOCK_G, HALF], tl.float32)
    dk0 = dm0[None, None, :]
    dk1 = dm1[None, None, :]
    for n0 in range(start, kv_end, BLOCK_N):
        offs = n0 + keys
        nm = offs < kv_end
        slots = next_slots  # loaded one block ahead, as in the split kernel
        next_slots = tl.load(table + offs + BLOCK_N, mask=offs + BLOCK_N < kv_end,
                             other=0).to(tl.int64)
        kp = k_ptr + slots[:, :, None] * k_s0 + kvh * k_s1 + d[None, None, :]
        if FP8_QK:
            k0 = tl.trans(tl.load(kp, mask=nm[:, :, None] & dk0, other=0.0), (0, 2, 1))
            s = tl.dot(l0, k0, tl.dot(h0, k0))
            k1 = tl.trans(tl.load(kp + HALF, mask=nm[:, :, None] & dk1, other=0.0), (0, 2, 1))
            s = tl.dot(l1, k1, tl.dot(h1, k1, s)) * s_scale
        else:
            k0 = tl.load(kp, mask=nm[:, :, None] & dk0, other=0.0).to(q0.dtype)
            s = tl.dot(q0, tl.trans(k0, (0, 2, 1)), input_precision=PRECISION)
            k1 = tl.load(kp + HALF, mask=nm[:, :, None] & dk1, other=0.0).to(q0.dtype)
            s = tl.dot(q1, tl.trans(k1, (0, 2, 1)), s, input_precision=PRECISION) * scale
        s = tl.where(nm[:, None, :], s, float("-inf"))
        m_i, alpha, p, l_i = softmax_step(s, m_i, l_i, 2)
        p = p.to(q0.dtype)
        vp = v_ptr + slots[:, :, None] * v_s0 + kvh * v_s1 + d[None, None, :]
        v0 = tl.load(vp, mask=nm[:, :, None] & dk0, other=0.0).to(q0.dtype)
        acc0 = acc0 * alpha[:, :, None] + tl.dot(p, v0, input_precision=PRECISION)
        v1 = tl.load(vp + HALF, mask=nm[:, :, None] & dk1, other=0.0).to(q0.dtype)
        acc1 = acc1 * alpha[:, :, None] + tl.dot(p, v1, input_precision=PRECISION)
    # merge the slices (a slice that saw no key has m -inf, weight 0)
    m = tl.max(m_i, 0)
    w = tl.exp(m_i - tl.where(m == float("-inf"), 0.0, m)[None, :])
    l_t = tl.sum(l_i * w, 0)
    o0 = tl.sum(acc0 * w[:, :, None], 0)
    o1 = tl.sum(acc1 * w[:, :, None], 0)
    m, l_t, o0, o1 = fold_new_token(m, l_t, o0, o1, qn0, qn1, nk1, nk2, nv1, nv2, start, end,
                                    seq_len, scale, ROPE)
    write_split(o0, o1, m, l_t, v_scale, b, split, heads, gm, d, dm0, dm1, out_ptr, o_s0, o_s1,
                mid_o_ptr, mo_s0, mo_s1, mo_s2, mid_lse_ptr, ml_s0, ml_s1, NUM_SPLITS, HALF)


@triton.jit
def split_q_e4m3(q0, q1, SLICES: tl.constexpr, BLOCK_G: tl.constexpr, HALF: tl.constexpr):
    """The two head_dim halves of q ([BLOCK_G, HALF] each, bf16 values), each head scaled by a
    power of two (`qk_scale`) that puts its largest |q| in [128, 256), then split into e4m3
    parts hi + lo that add up to it exactly: bf16's 8 significant bits are twice e4m3's 4 (a
    value under e4m3's subnormal step, 2^-9 against a largest of 128+, keeps what fits).
    Broadcast to the slices; returns (hi0, lo0, hi1, lo1, qk_scale). The parts are cut after
    the broadcast: 8-bit operands broadcast into the dot gave wrong scores on the H200
    (Triton 3.6)."""
    q0 = q0.to(tl.float32)
    q1 = q1.to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(q0), 1), tl.max(tl.abs(q1), 1))
    qk_scale = tl.exp2(7.0 - tl.floor(tl.log2(tl.where(amax > 0, amax, 1.0))))
    q0 = tl.broadcast_to((q0 * qk_scale[:, None])[None, :, :], (SLICES, BLOCK_G, HALF))
    q1 = tl.broadcast_to((q1 * qk_scale[:, None])[None, :, :], (SLICES, BLOCK_G, HALF))
    h0 = q0.to(tl.float8e4nv)
    h1 = q1.to(tl.float8e4nv)
    return (h0, (q0 - h0.to(tl.float32)).to(tl.float8e4nv), h1,
            (q1 - h1.to(tl.float32)).to(tl.float8e4nv), qk_scale)
