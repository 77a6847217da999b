"""Shared helpers for sharded parameters."""

from __future__ import annotations

import torch
from torch import nn

from radixserve.layers.lazy_weight import materialize


def new_param(*shape: int) -> nn.Parameter:
    """An uninitialised inference parameter on the ambient default device and dtype (the loader
    builds models under `torch.device("meta")` and fills them later)."""
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def divide(total: int, parts: int, field: str) -> int:
    if total % parts:
        raise ValueError(f"{field}={total} is not divisible by the tensor-parallel size {parts}")
    return total // parts


def copy_shard(dst: torch.Tensor, full: torch.Tensor, dim: int, index: int, size: int) -> None:
    """Copy block `index` of `size` along `dim` of the full tensor into `dst` (converts dtype and
    device on the way)."""
    src = full.narrow(dim, index * size, size)
    if src.shape != dst.shape:
        raise ValueError(
            f"weight shard shape {tuple(src.shape)} does not fit parameter {tuple(dst.shape)}"
        )
    dst.copy_(materialize(src))


def check_shape(param: torch.Tensor, full: torch.Tensor) -> None:
    if param.shape != full.shape:
        raise ValueError(
            f"weight shape {tuple(full.shape)} does not match parameter {tuple(param.shape)}"
        )
