"""How many KV pages fit in a memory budget."""
from __future__ import annotations

import torch


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of K plus V one token occupies across all layers (on one TP rank)."""
    dims = {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
    for name, value in dims.items():
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def num_pages_for_budget(budget_bytes: int, bytes_per_token: int, page_size: int) -> int:
    """Allocatable pages that fit in `budget_bytes`, keeping room for the pool's scratch page.

    May be 0: the caller decides whether that is an error worth reporting."""
    if bytes_per_token < 1:
        raise ValueError(f"bytes_per_token must be positive, got {bytes_per_token}")
    if page_size < 1:
        raise ValueError(f"page_size must be positive, got {page_size}")
    total_pages = max(budget_bytes, 0) // (bytes_per_token * page_size)
    return max(total_pages - 1, 0)  # NOTE: MHAKVPool adds one scratch page past the last one
