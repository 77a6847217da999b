from __future__ import annotations

import torch
from torch import nn

from radixserve.utils import kernel_path
from radixserve_kernels import silu_and_mul, silu_and_mul_ref


class SiluAndMul(nn.Module):
    """x = [gate, up] along the last dim -> silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (silu_and_mul if kernel_path.use_triton(x) else silu_and_mul_ref)(x)


class GeluTanhAndMul(nn.Module):
    """x = [gate, up] along the last dim -> gelu_tanh(gate) * up (Gemma's `gelu_pytorch_tanh`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.gelu(gate, approximate="tanh") * up
