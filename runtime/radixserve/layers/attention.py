"""The attention call inside a decoder layer: hands q/k/v to the backend of the forward context,
which also stores k/v in the KV pool."""

from __future__ import annotations

import torch
from torch import nn

from radixserve.engine.context import get_context


class AttentionLayer(nn.Module):
    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        """Head counts are this rank's."""
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq*D], k/v [T, Hkv*D] -> [T, Hq*D]."""
        ctx = get_context()
        assert ctx.attn_backend is not None and ctx.batch is not None, (
            "model run outside forward_batch"
        )
        t, d = q.shape[0], self.head_dim
        out = ctx.attn_backend.forward(
            q.view(t, self.num_heads, d),
            k.view(t, self.num_kv_heads, d),
            v.view(t, self.num_kv_heads, d),
            self.layer_id,
            ctx.batch,
        )
        return out.reshape(t, self.num_heads * d)
