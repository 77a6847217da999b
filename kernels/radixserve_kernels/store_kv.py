"""Write the new tokens' K and V into the paged pool: cache[out_loc[t]] = k[t] (and v), quantized
with the per-tensor scales when the cache is FP8 (`kv_quant`)."""
from __future__ import annotations

import torch

from radixserve_kernels._utils import next_pow2
from radixserve_kernels.kv_quant import FP8_MAX, is_fp8, quantize_kv_ref, scatter_kv_


def store_kv_ref(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out_loc: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    scatter_kv_(k_cache, out_loc, quantize_kv_ref(k, k_cache.dtype, k_scale))
    scatter_kv_(v_cache, out_loc, quantize_kv_ref(v, v_cache.dtype, v_scale))


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out_loc: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """Triton twin of `store_kv_ref`: caches `[S, Hkv, D]`, k/v `[T, Hkv, D]` (strided views
    allowed, last dim contiguous), out_loc `[T]`. One launch, no host sync; the scales are plain
    floats, so a CUDA graph captures them as constants."""
    from radixserve_kernels._jit.store import store_kv_kernel

    t, n_heads, head_dim = k.shape
    if not t:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    store_kv_kernel[(t,)](
        k_cache, v_cache, k, v, out_loc,
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), n_heads, head_dim,
        1.0 / k_scale, 1.0 / v_scale,
        FP8=is_fp8(k_cache.dtype), FP8_MAX=FP8_MAX,
        BLOCK_H=next_pow2(n_heads), BLOCK_D=next_pow2(head_dim), num_warps=4,
    )
