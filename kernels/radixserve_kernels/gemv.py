"""`x @ W.T (+ b)` for a handful of rows (decode at small batch): a memory-bound weight stream.

Each program reads one block of weight rows once, for all rows of x, with no split-K reduction
pass. On the H200 at Qwen3-0.6B's four projections and 8/16 rows the tiled kernel is faster than
cuBLAS in most cases and at most 7% slower in the others. One row takes its own kernel, without
tensor cores, whose programs hold as few as 4 weight rows: four to eight times the programs,
1.2-1.7x faster than the tiled kernel per projection and 0.87 ms instead of 1.04 per batch-1
decode step (docs/benchmarks.md).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from radixserve_kernels._utils import cdiv, dot_precision, next_pow2, pdl_args

SKINNY_MAX_M = 16  # rows one program holds (tl.dot's smallest tile)


def skinny_gemm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def skinny_gemm_config(n: int, k: int, elem_bytes: int = 2) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for an [n, k] weight, the best of a sweep on the
    H200 at Qwen3-0.6B's four projections in bf16 (weights rotated past L2): long rows take
    narrow, deep blocks; wide outputs take wider blocks. 4-byte types get half as deep a block,
    the same bytes of shared memory."""
    if k >= 2048:
        block_n, block_k, stages = 16, 512, 3
    else:
        block_n, block_k, stages = (64 if n >= 6144 else 32), (256 if k >= 256 else 64), 4
    return block_n, block_k * 2 // elem_bytes, 4, stages


def gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) of the one-row kernel for an [n, k] weight, the
    best of a sweep of 144 on the H200 at Qwen3-0.6B's projections (weights rotated past L2):
    long rows take 8 warps over 1,024 columns; wide outputs 8 rows a program."""
    if k >= 2048:
        return 4, 1024, 8, 3
    return (8, 512, 4, 2) if n >= 6144 else (4, 1024, 2, 1)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Triton twin of `skinny_gemm_ref` for x [M <= 16, K] (rows may be strided, last dim
    contiguous), weight [N, K] contiguous."""
    from radixserve_kernels._jit.gemv import skinny_gemm_kernel

    m, k = x.shape
    n = weight.shape[0]
    if m > SKINNY_MAX_M:
        raise ValueError(f"skinny_gemm takes at most {SKINNY_MAX_M} rows, got {m}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    assert weight.is_contiguous(), "the weight must be contiguous"
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 1:
        _gemv(x, weight, bias, y, gated=False)
    elif m:
        block_n, block_k, warps, stages = skinny_gemm_config(n, k, x.element_size())
        skinny_gemm_kernel[(cdiv(n, block_n),)](
            x, weight, bias if bias is not None else weight, y, m, n, k,
            x.stride(0), weight.stride(0), y.stride(0),
            HAS_BIAS=bias is not None, PRECISION=dot_precision(x.dtype),
            BLOCK_M=SKINNY_MAX_M, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps, num_stages=stages, **pdl_args(x),
        )
    return y


def silu_mul_gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    from radixserve_kernels.activation import silu_and_mul_ref

    return F.linear(silu_and_mul_ref(x), weight, bias)


def silu_mul_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Triton twin of `silu_mul_gemv_ref` for one row x [1, 2K] = [gate | up] and weight [N, K]:
    a gated MLP's down projection with the activation computed as the input is read (each
    program recomputes the 2K-wide row from L2), one launch instead of two at batch 1. Gives
    `silu_and_mul` then `skinny_gemm`'s bits."""
    n, k = weight.shape
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != 2 * k:
        raise ValueError(f"silu_mul_gemv takes x [1, {2 * k}] for a weight {list(weight.shape)}, "
                         f"got {list(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    assert weight.is_contiguous(), "the weight must be contiguous"
    return _gemv(x, weight, bias, torch.empty(1, n, dtype=x.dtype, device=x.device), gated=True)


class GemvLoRA(NamedTuple):
    """The adapter update `_gemv` adds to its row (`lora_gemv`): `planes` [splits, 1, P*R] the
    shrink's partial planes, `b` [S, N, R] contiguous, `slot` [1] int32 (-1: none), `ends`
    where projections 0 and 1 end."""

    planes: torch.Tensor
    b: torch.Tensor
    slot: torch.Tensor
    ends: tuple[int, int]


def _gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
          gated: bool, lora: GemvLoRA | None = None) -> torch.Tensor:
    """The one-row kernel into y [1, N]; `gated`: x is [gate | up] and the row is their product;
    `lora`: plus that update."""
    from radixserve_kernels._jit.gemv import gemv_kernel

    n, k = weight.shape
    block_n, block_k, warps, stages = gemv_config(n, k)
    if lora is None:
        extra, meta = (weight, weight, weight, 0, 0, 0, 0, 0), {"PLANES": 1, "BLOCK_R": 1}
    else:
        rank = lora.b.shape[2]
        extra = (lora.planes, lora.b, lora.slot, lora.planes.stride(0), lora.b.stride(0),
                 *lora.ends, rank)
        meta = {"PLANES": lora.planes.shape[0], "BLOCK_R": max(16, next_pow2(rank))}
    gemv_kernel[(cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, n, k, weight.stride(0), *extra,
        HAS_BIAS=bias is not None, GATED=gated, BLOCK_N=block_n, BLOCK_K=block_k,
        LORA=lora is not None, **meta, num_warps=warps, num_stages=stages, **pdl_args(x),
    )
    return y
