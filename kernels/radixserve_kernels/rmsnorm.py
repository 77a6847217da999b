"""RMSNorm, optionally fused with the residual add, matching transformers' Llama/Qwen RMSNorm:
normalise in fp32, round to the input dtype, then multiply by the weight."""
from __future__ import annotations

import torch

from radixserve_kernels._utils import next_pow2, pdl_args


def _into(value: torch.Tensor, dest: torch.Tensor | None) -> torch.Tensor:
    return value if dest is None else dest.copy_(value)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """`out`: write the result there (a CUDA graph's static buffer) and return it."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return _into(weight * normed.to(x.dtype), out)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual), each in its buffer when given."""
    new_residual = _into(x + residual, residual_out)
    return rms_norm_ref(new_residual, weight, eps, out), new_residual


def _as_rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """View x [..., D] as (outer, inner) rows with strides; copies only if the view is irregular."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 3:
        return x, x.stride(0), x.stride(1), x.shape[1]
    x2 = x.reshape(-1, x.shape[-1])
    return x2, x2.stride(0), 0, 1


def _launch(x, residual, weight, eps, out=None, residual_out=None):
    from radixserve_kernels._jit.norm import rmsnorm_kernel

    d = x.shape[-1]
    xr, xs0, xs1, inner = _as_rows(x)
    # the kernel writes both outputs row-major with x's shape (given buffers must be so too)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        assert out.shape == x.shape and out.is_contiguous(), "out: contiguous, x's shape"
    rows = out.numel() // d
    if residual is None:
        rr, rs0, rs1, res_out = xr, 0, 0, out
    else:
        rr, rs0, rs1, r_inner = _as_rows(residual.view(x.shape))
        assert r_inner == inner, "residual must have x's shape"
        if residual_out is None:
            res_out = torch.empty_like(out)
        else:
            assert residual_out.shape == x.shape and residual_out.is_contiguous(), (
                "residual_out: contiguous, x's shape")
            res_out = residual_out
    block = next_pow2(d)
    if rows:
        rmsnorm_kernel[(rows,)](
            xr, rr, weight, out, res_out, xs0, xs1, rs0, rs1, inner, d, eps,
            HAS_RES=residual is not None, BLOCK=block, num_warps=min(max(block // 256, 1), 8),
            **pdl_args(x),
        )
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton twin of `rms_norm_ref` (x [..., D], last dim contiguous; a new tensor unless
    `out` is given)."""
    return _launch(x, None, weight, eps, out)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `fused_add_rms_norm_ref`: one pass reads x and residual once."""
    return _launch(x, residual, weight, eps, out, residual_out)
