from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def quantize(x, inv_scale, FP8: tl.constexpr, FP8_MAX: tl.constexpr):
    """`kv_quant.quantize_kv_ref` before the cast: for an FP8 cache, x * (1/scale) clamped to the
    finite e4m3 range in float32; other caches get x unchanged."""
    if FP8:
        x = tl.clamp(x.to(tl.float32) * inv_scale, -FP8_MAX, FP8_MAX)
    return x


@triton.jit
def store_kv_kernel(
    kc_ptr, vc_ptr, k_ptr, v_ptr, loc_ptr,
    kc_s0, kc_s1, vc_s0, vc_s1, k_s0, k_s1, v_s0, v_s1, n_heads, head_dim, k_inv, v_inv,
    FP8: tl.constexpr, FP8_MAX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n_heads) & (d < head_dim)
    k = quantize(tl.load(k_ptr + t * k_s0 + h * k_s1 + d, mask=mask), k_inv, FP8, FP8_MAX)
    v = quantize(tl.load(v_ptr + t * v_s0 + h * v_s1 + d, mask=mask), v_inv, FP8, FP8_MAX)
    tl.store(kc_ptr + slot * kc_s0 + h * kc_s1 + d, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + slot * vc_s0 + h * vc_s1 + d, v.to(vc_ptr.dtype.element_ty), mask=mask)
