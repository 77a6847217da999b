"""Paged decode attention (one new token per request), GQA, any page size.

The page table holds token-level KV slots (`page_table[row, j]` = slot of token j), so the kernel
never needs the page size. Flash-decoding: each request's keys are cut into `num_splits` slices
run in parallel, then merged by log-sum-exp. The split count and the key-block shape depend only
on the batch size's next power of two, so a CUDA-graph replay padded up to a captured size
computes bit-identical results to an eager run of the same requests (when the captured sizes
include the powers of two).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from radixserve_kernels._utils import (
    device_sms,
    dot_precision,
    fp8_mma_capable,
    next_pow2,
    pdl_args,
    window_arg,
)
from radixserve_kernels.kv_quant import FP8_MAX, dequantize_kv_ref, gather_kv, is_fp8
from radixserve_kernels.rotary import qk_norm_rope_ref
from radixserve_kernels.store_kv import store_kv_ref


class RopeParams(NamedTuple):
    """How q and k are normed and rotated, as `qk_norm_rope_` takes it: `cos_sin_cache`,
    Qwen3's per-head norm weights (or None) and their eps."""

    cos_sin_cache: torch.Tensor
    q_weight: torch.Tensor | None = None
    k_weight: torch.Tensor | None = None
    eps: float = 0.0


class NewTokenKV(NamedTuple):
    """A decode batch's new token as the qkv projection leaves it, for `decode_attention` to do
    the rotary kernel's job in its own launch: k and v [B, Hkv, D] (strided views are fine, last
    dim contiguous), the cache slots they go to [B], and how q and k are normed and rotated. The
    token sits at position seq_len - 1 of its request."""

    k: torch.Tensor
    v: torch.Tensor
    out_loc: torch.Tensor
    rope: RopeParams


def decode_rope_fusable(head_dim: int) -> bool:
    """Whether `decode_attention` can take a `NewTokenKV`: its kernels cut head_dim into two
    halves of a power of two each, which must be rotary's halves."""
    return head_dim >= 32 and head_dim & (head_dim - 1) == 0


def rotate_new_token_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
    new: NewTokenKV, k_scale: float = 1.0, v_scale: float = 1.0,
) -> torch.Tensor:
    """What `decode_attention` does first with a `NewTokenKV`: store the new k (normed and
    rotated) and v in the caches; returns q normed and rotated (a new tensor)."""
    q, k = qk_norm_rope_ref(q, new.k, seq_lens.long() - 1, *new.rope)
    store_kv_ref(k_cache, v_cache, k, new.v, new.out_loc, k_scale, v_scale)
    return q


def decode_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    req_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float,
    k_scale: float = 1.0, v_scale: float = 1.0, new_kv: NewTokenKV | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [B, Hq, D]; caches [S, Hkv, D]; page_table [R, L]; req_rows, seq_lens [B] -> [B, Hq, D].
    `k_scale`/`v_scale`: an FP8 cache's per-tensor scales (`kv_quant`). `new_kv`: q and the new
    token's k are rotated, and k/v stored, first (`rotate_new_token_ref`). `window` W: the query
    (at position seq_len - 1) sees only the last W keys; None: all of them."""
    out = torch.empty_like(q)
    if new_kv is not None:
        q = rotate_new_token_ref(q, k_cache, v_cache, seq_lens, new_kv, k_scale, v_scale)
    for i, (row, n) in enumerate(zip(req_rows.tolist(), seq_lens.tolist())):
        slots = page_table[row, :n].long()
        keys = dequantize_kv_ref(gather_kv(k_cache, slots), k_scale).transpose(0, 1)
        vals = dequantize_kv_ref(gather_kv(v_cache, slots), v_scale).transpose(0, 1)
        mask = None
        if window is not None:
            mask = (torch.arange(n) > n - 1 - window).to(q.device)
        o = F.scaled_dot_product_attention(
            q[i, :, None].float(), keys, vals, attn_mask=mask, scale=scale,
            enable_gqa=q.shape[1] != keys.shape[0],
        )
        out[i] = o[:, 0].to(q.dtype)
    return out


def decode_num_splits(bs: int, num_kv_heads: int, num_sms: int) -> int:
    """Enough (request, head, split) programs to fill the GPU a few times over, at most 16."""
    target = 4 * num_sms // (next_pow2(bs) * num_kv_heads)
    return min(16, 1 << max(target, 1).bit_length() - 1)


MAX_DECODE_BS = 65535  # the requests are the grid's third axis, which CUDA caps there
ORDER_MIN_BS = 64  # fewer requests' programs start in about one wave: their order cannot matter


def decode_order(seq_lens: torch.Tensor) -> torch.Tensor | None:
    """A decode batch's launch order for `decode_attention`: the longest request first, or None
    (batch order) under ORDER_MIN_BS requests. The GPU starts programs in launch order, so the
    longest start first and the shortest fill in at the end, instead of a long request started
    last running alone (on the H200, FP8 cache, 256 requests of 100-2,048 keys: 206 -> 184 µs;
    docs/benchmarks.md). Stable, so ties keep batch order."""
    if seq_lens.shape[0] < ORDER_MIN_BS:
        return None
    return torch.argsort(seq_lens, descending=True, stable=True)


def decode_order_cpu(seq_lens: list[int]) -> list[int] | None:
    """`decode_order` from the lengths the host already holds: a runtime sorts there and copies
    the order in, one copy a step where the device's sort took a radix sort's kernels (18 µs at
    256 requests on the H200, outside the decode graph: docs/benchmarks.md)."""
    if len(seq_lens) < ORDER_MIN_BS:
        return None
    return sorted(range(len(seq_lens)), key=seq_lens.__getitem__, reverse=True)


class DecodeShape(NamedTuple):
    """A decode launch's shape: keys per block, pipeline stages, warps, and whether each warp
    takes its own slice of every block (`decode_sliced_kernel`) or all share it (the split
    kernel); `fp8_qk` (sliced only): the QK dots read an e4m3 cache's keys as they are, against
    q split into two e4m3 parts (`fp8_qk_dots` says when the launcher may)."""
    block_n: int
    stages: int
    warps: int
    sliced: bool
    fp8_qk: bool = False


def decode_block_config(bs: int, block_d: int, elem_bytes: int, kv_bytes: int,
                        fp8_qk: bool = False) -> DecodeShape:
    """The launch shape, from sweeps of both kernels on the H200 at the offline benchmark's mixes
    of lengths (`elem_bytes` q's, `kv_bytes` the cache's). An FP8 cache under a 16-bit q at 16 or
    more requests: the sliced kernel, 64-key blocks over 2 warps at 64 and at 256 requests (69
    and 201 µs), 32 keys on 1 warp at 128 (112 µs) and at 16 (24 µs; 32 requests take 16's shape
    untimed). Where the QK dots may read FP8 (`fp8_qk`, `fp8_qk_dots`), from 128 requests on
    they do (FP8_QK_SHAPES). Fewer requests, and 16-bit caches, keep the split kernel: FP8
    128-key blocks three deep; a 16-bit q over a 16-bit cache takes SHAPES_16BIT; anything else
    128-key blocks two deep. Like the split count it depends only on the batch size's next power
    of two."""
    if block_d > 128:
        return DecodeShape(32, 2, 4, False)
    if kv_bytes == 2 and elem_bytes == 2:
        return SHAPES_16BIT[min(next_pow2(bs), 256)]
    if kv_bytes == 1 and elem_bytes == 2:
        n = next_pow2(bs)
        if fp8_qk and n >= 128:
            return FP8_QK_SHAPES[min(n, 256)]
        if n == 64 or n >= 256:
            return DecodeShape(64, 3, 2, True)
        if n == 128:
            return DecodeShape(32, 3, 1, True)
        if n >= 16:
            return DecodeShape(32, 4, 1, True)
        return DecodeShape(128, 3, 4, False)
    return DecodeShape(128, 2, 4, False)


# a 16-bit cache's shapes by batch size's next power of two (256 stands for all above), from
# sweeps of the split kernel on the H200 at the offline workload's lengths, bf16, mean µs over
# four to six draws of lengths (docs/benchmarks.md): 160-256 requests 2.3-5.3
# µs less a layer on 64-key blocks over two warps, 4-8 requests 2-4 less on 32-key blocks over
# two, 12-32 requests 0.4-2.4 less on 64-key blocks three deep; 64 and 128 requests keep
# 128-key blocks, as fast as any there
_KEYS64_DEEP = DecodeShape(64, 3, 4, False)
_KEYS32 = DecodeShape(32, 3, 2, False)
_KEYS128 = DecodeShape(128, 2, 4, False)
SHAPES_16BIT = {1: _KEYS64_DEEP, 2: _KEYS64_DEEP, 4: _KEYS32, 8: _KEYS32, 16: _KEYS64_DEEP,
                32: _KEYS64_DEEP, 64: _KEYS128, 128: _KEYS128, 256: DecodeShape(64, 2, 2, False)}

# the FP8-key shapes by batch size's next power of two (256 stands for all above), from a
# sweep on the H200 at 100-2,048 keys (docs/benchmarks.md)
FP8_QK_SHAPES = {128: DecodeShape(64, 3, 2, True, True), 256: DecodeShape(32, 3, 1, True, True)}


def fp8_qk_dots(q: torch.Tensor, kv_dtype: torch.dtype) -> bool:
    """Whether the QK dots can take an e4m3 cache's keys as they are: q in bf16 (whose 8
    significant bits two e4m3 parts hold exactly), head_dim over 32 (each dot takes half of it,
    and an FP8 MMA 32 at least), on a GPU with FP8 MMA (sm89+) or in Triton's interpreter."""
    if q.dtype != torch.bfloat16 or not is_fp8(kv_dtype) or q.shape[-1] <= 32:
        return False
    return not q.is_cuda or fp8_mma_capable(q.device.index or 0)


def f16_dots(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> bool:
    """Whether the kernel computes its dots in float16: for a bf16 q over an FP8 cache (on the
    H200 at batch 256, 241 µs where widening the cache to bf16 takes 279 at the same shape)."""
    return q_dtype == torch.bfloat16 and is_fp8(kv_dtype)


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    req_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float,
    num_splits: int | None = None, out: torch.Tensor | None = None,
    k_scale: float = 1.0, v_scale: float = 1.0, shape: DecodeShape | None = None,
    order: torch.Tensor | None = None, new_kv: NewTokenKV | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Triton twin of `decode_attention_ref`; no host sync, so it is safe to capture in a CUDA
    graph (device tensors updated in place between replays; the scales are constants).
    seq_lens must be >= 1 for real requests; a 0-length row yields zeros. `shape` overrides
    `decode_block_config` (tests run both kernels at any size). `order`: the requests' launch
    order, a permutation of 0..bs-1 (`decode_order`); each request's result is the same
    whatever the order, bit for bit, only the time differs. `new_kv`: q comes unrotated and the
    kernel rotates it and stores the new k/v itself (`NewTokenKV`; the rotary kernel's launch
    saved); q is left as it came. `window`: a runtime argument of the kernels (full and windowed
    layers share one compiled kernel); the splits divide only the window's keys."""
    from radixserve_kernels._jit.decode import decode_merge_kernel, decode_split_kernel
    from radixserve_kernels._jit.decode_sliced import decode_sliced_kernel

    bs, n_qh, d = q.shape
    n_kh = k_cache.shape[1]
    if n_qh % n_kh:
        raise ValueError(f"num_qo_heads ({n_qh}) must be a multiple of num_kv_heads ({n_kh})")
    group = n_qh // n_kh
    if num_splits is None:
        num_splits = decode_num_splits(bs, n_kh, device_sms(q))
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if bs == 0:
        return out
    if bs > MAX_DECODE_BS:
        raise ValueError(f"decode_attention takes at most {MAX_DECODE_BS} requests a call, got {bs}")
    # with one split the kernel writes `out` itself and these stay unused
    mid_o = torch.empty(bs, n_qh, num_splits, d, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(bs, n_qh, num_splits, dtype=torch.float32, device=q.device)
    block_d = max(32, next_pow2(d))  # the split kernel dots head_dim in halves of >= 16
    fp8_qk = fp8_qk_dots(q, k_cache.dtype)
    if shape is None:  # (its shapes all give a slice a whole tile: tests/kernels/test_decode_shape.py)
        shape = decode_block_config(bs, block_d, q.element_size(), k_cache.element_size(), fp8_qk)
    elif shape.sliced and shape.block_n // shape.warps < 16:
        raise ValueError(f"{shape}: a slice needs >= 16 keys a block (the dot's minimum)")
    elif shape.fp8_qk and not (fp8_qk and shape.sliced):
        raise ValueError(f"{shape}: FP8 QK dots need the sliced kernel, a bf16 q, an e4m3 cache "
                         f"and FP8 MMA (sm89+); got q {q.dtype}, cache {k_cache.dtype}")
    rope_args, rope = _rope_args(new_kv, q, k_cache, seq_lens, k_scale, v_scale)
    kernel = decode_sliced_kernel if shape.sliced else decode_split_kernel
    slices = {"SLICES": shape.warps, "FP8_QK": shape.fp8_qk} if shape.sliced else {}
    pdl = pdl_args(q)  # the split and the merge kernel launch alike
    kernel[(n_kh, num_splits, bs)](
        q, k_cache, v_cache, page_table, req_rows, seq_lens,
        order if order is not None else seq_lens, mid_o, mid_lse, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), page_table.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1), scale * k_scale, v_scale, *rope_args, window_arg(window),
        GROUP=group, HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_G=max(16, next_pow2(group)),
        BLOCK_D=block_d, BLOCK_N=shape.block_n, PRECISION=dot_precision(q.dtype),
        F16_DOTS=f16_dots(q.dtype, k_cache.dtype), HAS_ORDER=order is not None, num_warps=shape.warps,
        num_stages=shape.stages, **rope, **slices, **pdl,
    )
    if num_splits == 1:
        return out
    decode_merge_kernel[(bs, n_qh)](
        mid_o, mid_lse, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits), BLOCK_D=block_d,
        num_warps=4, **pdl,
    )
    return out


def _rope_args(new_kv: NewTokenKV | None, q: torch.Tensor, k_cache: torch.Tensor,
               seq_lens: torch.Tensor, k_scale: float, v_scale: float) -> tuple[list, dict]:
    """The decode kernels' rotary arguments and constexprs; without `new_kv`, placeholders the
    kernels never read."""
    if new_kv is None:
        return [q, q, seq_lens, q, q, q, 0, 0, 0, 0, 0, 0.0, 1.0, 1.0], {
            "ROPE": False, "HAS_NORM": False, "FP8_STORE": False, "FP8_MAX": FP8_MAX}
    k, v, loc, (cs, qw, kw, eps) = new_kv
    bs, n_kh, d = q.shape[0], k_cache.shape[1], q.shape[-1]
    if not decode_rope_fusable(d):
        raise ValueError(f"decode_attention cannot rotate heads of {d} (decode_rope_fusable)")
    if k.shape != (bs, n_kh, d) or v.shape != k.shape or loc.shape != (bs,):
        raise ValueError(f"new_kv: k/v must be [{bs}, {n_kh}, {d}] and out_loc [{bs}], got "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(loc.shape)}")
    if k.stride(-1) != 1 or v.stride(-1) != 1 or cs.shape[-1] != d:
        raise ValueError("new_kv: k/v need a contiguous last dim and cos_sin_cache [positions, D]")
    has_norm = qw is not None and kw is not None
    args = [k, v, loc, cs, qw if has_norm else q, kw if has_norm else q, k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), cs.stride(0), eps, 1.0 / k_scale, 1.0 / v_scale]
    return args, {"ROPE": True, "HAS_NORM": has_norm, "FP8_STORE": is_fp8(k_cache.dtype),
                  "FP8_MAX": FP8_MAX}
