from __future__ import annotations

import torch

from radixserve.utils import kernel_path
from radixserve_kernels import silu_and_mul, silu_and_mul_ref


def silu_and_mul_any(x: torch.Tensor) -> torch.Tensor:
    """x = [gate, up] along the last dim -> silu(gate) * up, by the Triton kernel where it runs."""
    return (silu_and_mul if kernel_path.use_triton(x) else silu_and_mul_ref)(x)

