"""RMSNorm as transformers computes it (in float32, weight applied in the input dtype), with the
residual add fused into the call; on CUDA one Triton kernel does both."""

from __future__ import annotations

import torch
from torch import nn

from radixserve.layers.lazy_weight import materialize
from radixserve.layers.utils import check_shape, new_param
from radixserve.utils import kernel_path
from radixserve_kernels import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param(hidden)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, *,
        out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual). x may be a
        strided [T, H, D] view (per-head norms of a fused QKV). `out`/`residual_out`: contiguous
        buffers to write the results to (a CUDA graph's static outputs)."""
        triton = kernel_path.use_triton(x)
        if residual is None:
            return (rms_norm if triton else rms_norm_ref)(x, self.weight, self.eps, out)
        fn = fused_add_rms_norm if triton else fused_add_rms_norm_ref
        return fn(x, residual, self.weight, self.eps, out, residual_out)

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        check_shape(param, full)
        param.data.copy_(materialize(full))
