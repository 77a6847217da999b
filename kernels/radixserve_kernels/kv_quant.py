"""The FP8 (e4m3) KV cache's number format, shared by the store and attention kernels and their
references: a value x of a tensor with scale s is stored as `clamp(x * (1/s), -448, 448)` cast to
`float8_e4m3fn`, and read back as `fp8 * s`. One scale per tensor (a layer's K, or its V).

Caches of any other dtype store `x.to(cache dtype)` and ignore the scale (always 1.0 there).
The reciprocal is taken once on the host, so the reference and the kernels multiply by the same
float32 number and round to fp8 alike (division on the GPU is not correctly rounded).
"""
from __future__ import annotations

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value; past it the cast gives NaN, hence the clamp


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_KV_DTYPE


def quantize_kv_ref(x: torch.Tensor, cache_dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x in the cache's dtype: scaled, clamped and cast for FP8, a plain cast otherwise."""
    if not is_fp8(cache_dtype):
        return x.to(cache_dtype)
    return (x.float() * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(cache_dtype)


def dequantize_kv_ref(
    x: torch.Tensor, scale: float = 1.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Cache values `x` as `dtype`: times the scale for FP8, a plain cast otherwise."""
    if not is_fp8(x.dtype):
        return x.to(dtype)
    return (x.float() * scale).to(dtype)


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    # NOTE: indexing FP8 tensors is not implemented on every device; their bytes index anywhere
    return x.view(torch.uint8) if is_fp8(x.dtype) else x


def gather_kv(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`cache[index]`, for any cache dtype."""
    return _as_bytes(cache)[index].view(cache.dtype)


def scatter_kv_(cache: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """`cache[index] = values` (rows `index` [T] distinct, values already in the cache's dtype),
    for any cache dtype. NOTE: `index_copy_`, as `cache[index] = values` (index_put) took 6 ms
    on CPU where this takes 5 us (32 rows of 3 x 64 floats, torch 2.13)."""
    _as_bytes(cache).index_copy_(0, index.long(), _as_bytes(values))
