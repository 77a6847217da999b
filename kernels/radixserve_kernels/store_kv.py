"""Write the new tokens' K and V into the paged pool: cache[out_loc[t]] = k[t] (and v)."""
from __future__ import annotations

import torch

from radixserve_kernels._utils import next_pow2


def store_kv_ref(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out_loc: torch.Tensor,
) -> None:
    k_cache[out_loc] = k.to(k_cache.dtype)
    v_cache[out_loc] = v.to(v_cache.dtype)


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out_loc: torch.Tensor,
) -> None:
    """Triton twin of `store_kv_ref`: caches `[S, Hkv, D]`, k/v `[T, Hkv, D]` (strided views
    allowed, last dim contiguous), out_loc `[T]`. One launch, no host sync."""
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
        BLOCK_H=next_pow2(n_heads), BLOCK_D=next_pow2(head_dim), num_warps=4,
    )
