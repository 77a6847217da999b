from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.pdl import pdl_enter
from radixserve_kernels._jit.store import quantize


@triton.jit
def norm_rotate(x1, x2, w_ptr, cos, sin, d, half, eps, ty: tl.constexpr, HAS_NORM: tl.constexpr):
    """Rows of heads' two halves x1, x2 (float32, [heads, BLOCK_D], `d` the columns): per-head
    RMSNorm (optional), then the rotation, each product and sum rounded to `ty` (the model
    dtype), as transformers' eager rotary does. Returns the halves in `ty`. Shared by the rotary
    kernel and the decode kernels that rotate their new token themselves."""
    if HAS_NORM:  # as `rms_norm`: normalise in fp32, round, then multiply by the weight
        var = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half)
        rstd = (1.0 / tl.sqrt(var + eps))[:, None]
        w1 = tl.load(w_ptr + d, mask=d < half, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + half + d, mask=d < half, other=0.0).to(tl.float32)[None, :]
        x1 = ((x1 * rstd).to(ty).to(tl.float32) * w1).to(ty).to(tl.float32)
        x2 = ((x2 * rstd).to(ty).to(tl.float32) * w2).to(ty).to(tl.float32)
    a1 = (x1 * cos).to(ty).to(tl.float32)
    b1 = (x2 * sin).to(ty).to(tl.float32)
    a2 = (x2 * cos).to(ty).to(tl.float32)
    b2 = (x1 * sin).to(ty).to(tl.float32)
    return (a1 - b1).to(ty), (a2 + b2).to(ty)


@triton.jit
def cos_sin(cache_ptr, cache_s0, pos, d, half, ty: tl.constexpr):
    """Position `pos`'s cos and sin halves ([1, BLOCK_D] float32, rounded through `ty` as
    transformers' cache in the model dtype)."""
    row = cache_ptr + pos * cache_s0
    cos = tl.load(row + d, mask=d < half, other=0.0).to(ty).to(tl.float32)
    sin = tl.load(row + half + d, mask=d < half, other=0.0).to(ty).to(tl.float32)
    return cos[None, :], sin[None, :]


@triton.jit
def _norm_rotate_heads(ptr, s_t, s_h, t, n_heads, w_ptr, cos, sin, half, eps,
                       HAS_NORM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """`norm_rotate` of one token's heads, in place. Returns the stored halves."""
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < n_heads) & (d[None, :] < half)
    off = t * s_t + h[:, None] * s_h + d[None, :]
    ty = ptr.dtype.element_ty
    x1 = tl.load(ptr + off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + off + half, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = norm_rotate(x1, x2, w_ptr, cos, sin, d, half, eps, ty, HAS_NORM)
    tl.store(ptr + off, y1, mask=mask)
    tl.store(ptr + off + half, y2, mask=mask)
    return y1, y2


@triton.jit
def store_row(c_ptr, off, half, x1, x2, mask, inv_scale, FP8: tl.constexpr,
               FP8_MAX: tl.constexpr):
    """Both halves of one token's heads into a cache row, quantized (FP8) and cast to the cache
    dtype; returns the two halves as stored."""
    ty = c_ptr.dtype.element_ty
    y1 = quantize(x1, inv_scale, FP8, FP8_MAX).to(ty)
    y2 = quantize(x2, inv_scale, FP8, FP8_MAX).to(ty)
    tl.store(c_ptr + off, y1, mask=mask)
    tl.store(c_ptr + off + half, y2, mask=mask)
    return y1, y2


@triton.jit
def qk_norm_rope_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr, qw_ptr, kw_ptr,
    q_st, q_sh, k_st, k_sh, cache_s0, n_qh, n_kh, half, eps,
    v_ptr, kc_ptr, vc_ptr, loc_ptr, v_st, v_sh, kc_s0, kc_s1, vc_s0, vc_s1, k_inv, v_inv,
    HAS_NORM: tl.constexpr, STORE_KV: tl.constexpr, FP8: tl.constexpr, FP8_MAX: tl.constexpr,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dm = d < half
    cos, sin = cos_sin(cache_ptr, cache_s0, pos, d, half, q_ptr.dtype.element_ty)
    _norm_rotate_heads(q_ptr, q_st, q_sh, t, n_qh, qw_ptr, cos, sin, half, eps,
                       HAS_NORM, BLOCK_QH, BLOCK_D)
    k1, k2 = _norm_rotate_heads(k_ptr, k_st, k_sh, t, n_kh, kw_ptr, cos, sin,
                                half, eps, HAS_NORM, BLOCK_KH, BLOCK_D)
    if STORE_KV:  # the rotated k and the untouched v into the KV cache row out_loc[t]
        slot = tl.load(loc_ptr + t).to(tl.int64)
        h = tl.arange(0, BLOCK_KH)[:, None]
        mask = (h < n_kh) & dm[None, :]
        store_row(kc_ptr, slot * kc_s0 + h * kc_s1 + d[None, :], half, k1, k2, mask, k_inv,
                   FP8, FP8_MAX)
        v_off = t * v_st + h * v_sh + d[None, :]
        v1 = tl.load(v_ptr + v_off, mask=mask)
        v2 = tl.load(v_ptr + v_off + half, mask=mask)
        store_row(vc_ptr, slot * vc_s0 + h * vc_s1 + d[None, :], half, v1, v2, mask, v_inv,
                   FP8, FP8_MAX)
