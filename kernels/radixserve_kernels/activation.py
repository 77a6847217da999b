"""SiLU-and-multiply for gated MLPs: x [T, 2I] = [gate | up] -> silu(gate) * up [T, I]."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve_kernels._utils import cdiv, next_pow2, pdl_args


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton twin of `silu_and_mul_ref` for x [T, 2I] (rows may be strided)."""
    from radixserve_kernels._jit.activation import silu_and_mul_kernel

    if x.stride(-1) != 1:
        x = x.contiguous()
    x2 = x.reshape(-1, x.shape[-1])
    inter = x2.shape[1] // 2
    out = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    block = min(next_pow2(inter), 1024)
    if x2.shape[0]:
        grid = (x2.shape[0], cdiv(inter, block))
        silu_and_mul_kernel[grid](x2, out, x2.stride(0), inter, BLOCK=block, num_warps=4,
                                  **pdl_args(x))
    return out.view(*x.shape[:-1], inter)

