"""Prefill/extend attention over a cached prefix: each request's new tokens attend to its whole
cached prefix plus, causally, to each other. K/V of the new tokens must already be in the pool.
A sliding window W (`window`) keeps, for the query at position p, only keys p-W+1..p."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve_kernels._utils import cdiv, dot_precision, next_pow2, window_arg
from radixserve_kernels.kv_quant import dequantize_kv_ref, gather_kv


def extend_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    req_rows: torch.Tensor, seq_lens: torch.Tensor, extend_lens: torch.Tensor, scale: float,
    k_scale: float = 1.0, v_scale: float = 1.0, window: int | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] (requests' new tokens, concatenated); seq_lens / extend_lens [B] -> [T, Hq, D].
    `k_scale`/`v_scale`: an FP8 cache's per-tensor scales (`kv_quant`). `window`: a sliding
    window's length in tokens, None for full causal attention."""
    out = torch.empty_like(q)
    start = 0
    for row, n, e in zip(req_rows.tolist(), seq_lens.tolist(), extend_lens.tolist()):
        slots = page_table[row, :n].long()
        keys = dequantize_kv_ref(gather_kv(k_cache, slots), k_scale).transpose(0, 1)
        vals = dequantize_kv_ref(gather_kv(v_cache, slots), v_scale).transpose(0, 1)
        qi = q[start:start + e].transpose(0, 1).float()  # [Hq, e, D]
        key, pos = torch.arange(n)[None, :], (n - e + torch.arange(e))[:, None]
        mask = key <= pos
        if window is not None:
            mask &= key > pos - window
        o = F.scaled_dot_product_attention(
            qi, keys, vals, attn_mask=mask.to(q.device), scale=scale,
            enable_gqa=q.shape[1] != keys.shape[0],
        )
        out[start:start + e] = o.transpose(0, 1).to(q.dtype)
        start += e
    return out


def extend_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    req_rows: torch.Tensor, seq_lens: torch.Tensor, extend_lens: torch.Tensor, scale: float,
    qo_start: torch.Tensor, max_extend: int, out: torch.Tensor | None = None,
    k_scale: float = 1.0, v_scale: float = 1.0, window: int | None = None,
) -> torch.Tensor:
    """Triton twin of `extend_attention_ref`. `qo_start [B]` is each request's first row in q
    (exclusive cumsum of extend_lens) and `max_extend` the host-side max of extend_lens, both
    passed in so the launch needs no host sync. `window`: a runtime argument of the kernel, so
    full and windowed layers share one compiled kernel; its key loop skips the blocks wholly
    before a query block's window."""
    from radixserve_kernels._jit.extend import extend_kernel

    t, n_qh, d = q.shape
    n_kh = k_cache.shape[1]
    if n_qh % n_kh:
        raise ValueError(f"num_qo_heads ({n_qh}) must be a multiple of num_kv_heads ({n_kh})")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    bs = seq_lens.shape[0]
    if t == 0 or bs == 0:
        return out
    block_d = max(16, next_pow2(d))
    block_m = 64 if block_d <= 128 else 32
    grid = (cdiv(max_extend, block_m), bs, n_qh)
    extend_kernel[grid](
        q, k_cache, v_cache, out, page_table, req_rows, seq_lens, extend_lens, qo_start,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1), page_table.stride(0),
        scale * k_scale, v_scale, window_arg(window),
        GROUP=n_qh // n_kh, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=64 if block_d <= 128 else 32,
        BLOCK_D=block_d, PRECISION=dot_precision(q.dtype), num_warps=4, num_stages=2,
    )
    return out
