"""Rotary position embedding, rotate-half (NeoX) style as in HF Llama and Qwen.

`cos_sin_cache[p]` holds `[cos(p * inv_freq) | sin(p * inv_freq)]` (fp32, width D). Building it
from transformers' `inv_freq` (and `attention_scaling`) covers default and `llama3` scaling alike.
"""
from __future__ import annotations

import torch

from radixserve_kernels._utils import next_pow2, pdl_args
from radixserve_kernels.kv_quant import FP8_MAX, is_fp8
from radixserve_kernels.rmsnorm import rms_norm_ref


def build_cos_sin_cache(
    inv_freq: torch.Tensor, max_positions: int, attention_scaling: float = 1.0
) -> torch.Tensor:
    """`[max_positions, D]` fp32 from `inv_freq [D/2]`, computed as transformers does."""
    pos = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(pos, inv_freq.float())
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1) * attention_scaling


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def apply_rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hkv, D], positions [T] -> rotated (q, k), new tensors."""
    half = q.shape[-1] // 2
    cs = cos_sin_cache[positions.long()]
    cos, sin = cs[:, None, :half].to(q.dtype), cs[:, None, half:].to(q.dtype)
    return _rotate_ref(q, cos, sin), _rotate_ref(k, cos, sin)


def qk_norm_rope_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's attention prologue: per-head RMSNorm of q and k (when weights are given), then the
    rotation. q [T, Hq, D], k [T, Hkv, D] -> new tensors."""
    if q_weight is not None and k_weight is not None:
        q, k = rms_norm_ref(q, q_weight, eps), rms_norm_ref(k, k_weight, eps)
    return apply_rotary_ref(q, k, positions, cos_sin_cache)


def qk_norm_rope_(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
    *, v: torch.Tensor | None = None, k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None, out_loc: torch.Tensor | None = None,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `qk_norm_rope_ref` in one launch, **in place** (q and k may be strided views
    of a fused QKV, last dim contiguous): one kernel instead of three in every decode layer.

    With `v`, `k_cache`, `v_cache` and `out_loc` (all or none) the same launch also does
    `store_kv_ref(k_cache, v_cache, k_rotated, v, out_loc, k_scale, v_scale)`: caches
    `[S, Hkv, D]`, any strides with a contiguous last dim, written in their own dtype (an FP8
    cache quantized with the per-tensor scales)."""
    from radixserve_kernels._jit.rotary import qk_norm_rope_kernel

    store = (v, k_cache, v_cache, out_loc)
    fused_store = all(x is not None for x in store)
    assert fused_store or all(x is None for x in store), "v, k_cache, v_cache, out_loc: all or none"
    assert q.stride(-1) == 1 and k.stride(-1) == 1, "in-place rotary needs a contiguous last dim"
    t, n_qh, d = q.shape
    n_kh = k.shape[1]
    if d % 2:
        raise ValueError(f"head_dim must be even for rotary, got {d}")
    has_norm = q_weight is not None and k_weight is not None
    if fused_store:
        assert v.shape == k.shape and k_cache.shape[1:] == v_cache.shape[1:] == k.shape[1:]
        assert v.stride(-1) == k_cache.stride(-1) == v_cache.stride(-1) == 1
    else:  # unused pointers and strides: the kernel reads none of them
        v, k_cache, v_cache, out_loc = k, k, k, positions
    if t:
        qk_norm_rope_kernel[(t,)](
            q, k, positions, cos_sin_cache, q_weight if has_norm else q, k_weight if has_norm else k,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
            n_qh, n_kh, d // 2, eps,
            v, k_cache, v_cache, out_loc, v.stride(0), v.stride(1),
            k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
            1.0 / k_scale, 1.0 / v_scale, HAS_NORM=has_norm, STORE_KV=fused_store,
            FP8=fused_store and is_fp8(k_cache.dtype), FP8_MAX=FP8_MAX, BLOCK_QH=next_pow2(n_qh),
            BLOCK_KH=next_pow2(n_kh), BLOCK_D=next_pow2(d // 2), num_warps=4,
            **pdl_args(q),
        )
    return q, k
