from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotate_heads(src, dst, s_t, s_h, t, n_heads, cos, sin, half,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < n_heads) & (d[None, :] < half)
    src_off = t * s_t + h[:, None] * s_h + d[None, :]
    dst_off = (t * n_heads + h[:, None]) * (2 * half) + d[None, :]
    x1 = tl.load(src + src_off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + src_off + half, mask=mask, other=0.0).to(tl.float32)
    ty = dst.dtype.element_ty
    # each product and sum rounded to the model dtype, as transformers' eager rotary does
    a1 = (x1 * cos).to(ty).to(tl.float32)
    b1 = (x2 * sin).to(ty).to(tl.float32)
    a2 = (x2 * cos).to(ty).to(tl.float32)
    b2 = (x1 * sin).to(ty).to(tl.float32)
    tl.store(dst + dst_off, (a1 - b1).to(ty), mask=mask)
    tl.store(dst + dst_off + half, (a2 + b2).to(ty), mask=mask)


@triton.jit
def rotary_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cache_ptr,
    q_st, q_sh, k_st, k_sh, cache_s0, n_qh, n_kh, half,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dm = d < half
    ty = qo_ptr.dtype.element_ty
    cos = tl.load(cache_ptr + pos * cache_s0 + d, mask=dm, other=0.0).to(ty).to(tl.float32)
    sin = tl.load(cache_ptr + pos * cache_s0 + half + d, mask=dm, other=0.0).to(ty).to(tl.float32)
    _rotate_heads(q_ptr, qo_ptr, q_st, q_sh, t, n_qh, cos[None, :], sin[None, :], half,
                  BLOCK_QH, BLOCK_D)
    _rotate_heads(k_ptr, ko_ptr, k_st, k_sh, t, n_kh, cos[None, :], sin[None, :], half,
                  BLOCK_KH, BLOCK_D)
