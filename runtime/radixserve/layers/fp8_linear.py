"""FP8 GEMMs for linear layers whose checkpoint weights are FP8 with per-channel or per-tensor
scales: the weight stays in FP8 (half the bytes a decode step reads), each activation row is
quantized with its own scale at run time, and `torch._scaled_mm` multiplies with both scales
(row-wise scaling: cuBLASLt on Hopper). Block-scaled checkpoints are dequantized at load instead
(`models/fp8_weights.py`)."""

from __future__ import annotations

import torch
from torch import nn

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
_MIN_SCALE = 1e-12  # an all-zero row still gets a finite scale


def fits_scaled_mm(weight_shape: torch.Size) -> bool:
    """cuBLASLt's FP8 GEMM needs both weight dims multiples of 16."""
    return weight_shape[0] % 16 == 0 and weight_shape[1] % 16 == 0


def to_fp8_linear(layer: nn.Module) -> None:
    """Give `layer` (a `_Linear`, materialised) an FP8 weight of the same shape and a float32
    `weight_scale` per output row, both to be filled by its weight loader."""
    w = layer.weight
    layer.weight = nn.Parameter(torch.empty(w.shape, dtype=FP8_DTYPE, device=w.device),
                                requires_grad=False)
    layer.weight_scale = nn.Parameter(
        torch.empty(w.shape[0], dtype=torch.float32, device=w.device), requires_grad=False)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in FP8, float32 scale [rows, 1]) with each row scaled onto FP8's full range."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=_MIN_SCALE)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ (weight [out, in] FP8 * weight_scale [out, 1]).T (+ bias) in x's dtype.
    NOTE: row-wise scaled FP8 GEMMs on CUDA only write bfloat16 (the loader keeps FP8 weights
    only for bfloat16 models); the CPU implementation, used by tests, writes x's dtype."""
    shape = x.shape
    xq, x_scale = quantize_rows(x.reshape(-1, shape[-1]))
    out_dtype = torch.bfloat16 if x.is_cuda else x.dtype
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1),
                         out_dtype=out_dtype).to(x.dtype)
    if bias is not None:
        y = y + bias
    y = y.reshape(*shape[:-1], weight.shape[0])
    return y if out is None else out.copy_(y)
