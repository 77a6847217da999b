"""RMSNorm as transformers computes it (in float32, weight applied in the input dtype), with the
residual add fused into the call so a kernel can replace both at once."""

from __future__ import annotations

import torch
from torch import nn

from radixserve.layers.utils import check_shape, new_param


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param(hidden)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual)."""
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        check_shape(param, full)
        param.data.copy_(full)
