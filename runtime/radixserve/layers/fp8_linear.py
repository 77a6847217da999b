"""FP8 GEMMs for linear layers whose checkpoint weights stay FP8 (half the bytes a decode step
reads), on CUDA:

- per-channel or per-tensor scales (`weight_scale` [out]): up to 16 rows (decode at small batch)
  take the weight-only Triton kernel (`radixserve_kernels.fp8_gemm`: the weight widened in
  registers, activations as they are); more rows quantize each activation row with its own scale
  and run `torch._scaled_mm` with both scales (row-wise scaling: cuBLASLt on Hopper).
- block scales (`weight_scale` [out, ceil(in / block_k)] while loading: the checkpoint's bn x bk
  block scales repeated over each block's rows, so a fused QKV or gate-up weight and a rank's row
  shard keep their own rows' scales wherever they start in a block; after loading, one row of
  scales per aligned group of rows that share them, `compact_block_scales`): one row takes the
  weight-only Triton kernel (no activation rounding); from `BLOCKWISE_MIN_ROWS` rows a weight of
  whole 128x128 blocks, on Hopper, takes cuBLASLt's block-scaled FP8 GEMM with activations
  quantized per row and 128 columns (`radixserve_kernels.fp8_blockwise`); any other takes the
  Triton kernel, tiled above 16 rows. CPU tensors (tests forcing this path) take its torch
  reference, which dequantizes the weight on each call.

Without a kept weight (CPU, float32 models) FP8 checkpoints are dequantized at load
(`models/fp8_weights.py`)."""

from __future__ import annotations

import torch
from torch import nn

from radixserve.utils import kernel_path
from radixserve_kernels import (
    SKINNY_MAX_M,
    blockwise_fits,
    blockwise_fp8_gemm,
    fp8_gemm,
    fp8_gemm_ref,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
# From this many rows a 128x128 block-scaled weight takes cuBLASLt's block-scaled FP8 GEMM
# (activations quantized per 128 columns); fewer take the weight-only one-row Triton kernel
BLOCKWISE_MIN_ROWS = 2
_MIN_SCALE = 1e-12  # an all-zero row still gets a finite scale


def fits_scaled_mm(weight_shape: torch.Size) -> bool:
    """cuBLASLt's FP8 GEMM needs both weight dims multiples of 16."""
    return weight_shape[0] % 16 == 0 and weight_shape[1] % 16 == 0


def to_fp8_linear(layer: nn.Module, block_k: int | None = None) -> None:
    """Give `layer` (a `_Linear`, materialised) an FP8 weight of the same shape and float32
    scales, both to be filled by its weight loader: one per output row, or with `block_k` one per
    output row and `block_k` input columns."""
    w = layer.weight
    rows, cols = w.shape
    shape = (rows,) if block_k is None else (rows, -(-cols // block_k))
    layer.weight = nn.Parameter(torch.empty(w.shape, dtype=FP8_DTYPE, device=w.device),
                                requires_grad=False)
    layer.weight_scale = nn.Parameter(
        torch.empty(shape, dtype=torch.float32, device=w.device), requires_grad=False)
    layer.scale_block_k = block_k
    layer.scale_block_n = 1


@torch.no_grad()
def compact_block_scales(layer: nn.Module, max_rows: int = 128) -> int:
    """Where a block-scaled FP8 layer's per-row scales repeat over aligned groups of rows (a
    checkpoint's 128-row blocks, unless a fused projection or a rank's shard starts mid-block),
    keep one row of scales a group: the one-row kernel then scales each column of x once per
    program rather than every product. The rows a scale row covers, at least 16 (1: unchanged)."""
    s = layer.weight_scale
    if s is None or layer.scale_block_k is None or layer.scale_block_n != 1:
        return layer.scale_block_n if s is not None else 1
    rows = max_rows
    while rows >= 16:
        compact = s[::rows]
        if torch.equal(compact.repeat_interleave(rows, 0)[:s.shape[0]], s):
            layer.weight_scale = nn.Parameter(compact.contiguous(), requires_grad=False)
            layer.scale_block_n = rows
            return rows
        rows //= 2
    return 1


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in FP8, float32 scale [rows, 1]) with each row scaled onto FP8's full range."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=_MIN_SCALE)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
               block: tuple[int, int] | None = None) -> torch.Tensor:
    """x [..., in] @ (weight [out, in] FP8 * weight_scale).T (+ bias) in x's dtype: scales
    [out] (one a row) or, with `block` (rows, columns), [ceil(out / rows), ceil(in / columns)].
    NOTE: row-wise scaled FP8 GEMMs on CUDA only write bfloat16 (cast to x's dtype after); the
    CPU implementation, used by tests, writes x's dtype."""
    shape = x.shape
    y = _fp8_gemm_2d(x.reshape(-1, shape[-1]), weight, weight_scale, bias, block)
    y = y.reshape(*shape[:-1], weight.shape[0])
    return y if out is None else out.copy_(y)


def _fp8_gemm_2d(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None, block: tuple[int, int] | None) -> torch.Tensor:
    """`fp8_linear` of x [M, in]: the GEMM each row count and scale layout takes (module doc)."""
    if (block is not None and x.shape[0] >= BLOCKWISE_MIN_ROWS
            and blockwise_fits(x, weight, weight_scale, block)):
        return blockwise_fp8_gemm(x, weight, weight_scale, bias)
    if block is not None or (x.shape[0] <= SKINNY_MAX_M and kernel_path.use_triton(x)):
        gemm = fp8_gemm if kernel_path.use_triton(x) else fp8_gemm_ref
        return gemm(x, weight, weight_scale, bias, block)
    xq, x_scale = quantize_rows(x)
    out_dtype = torch.bfloat16 if x.is_cuda else x.dtype
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1),
                         out_dtype=out_dtype).to(x.dtype)
    return y if bias is None else y + bias
