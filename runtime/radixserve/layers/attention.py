"""The attention call inside a decoder layer: hands q/k/v to the backend of the forward context,
which stores k/v in the KV pool unless a kernel already did (see `kv_destination`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from radixserve.core.context import get_context
from radixserve_kernels import NewTokenKV, RopeParams

if TYPE_CHECKING:
    from radixserve.attention.base import BaseAttnBackend
    from radixserve.core.batch import Batch


class KVDestination(NamedTuple):
    """Where a layer's new k/v go: rows `out_loc` [T] of caches [S, Hkv, D], quantized with the
    layer's scales when the caches are FP8 (1.0 otherwise)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    out_loc: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0


def _running() -> tuple[BaseAttnBackend, Batch]:
    ctx = get_context()
    assert ctx.attn_backend is not None and ctx.batch is not None, (
        "model run outside forward_batch"
    )
    return ctx.attn_backend, ctx.batch


class AttentionLayer(nn.Module):
    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        """Head counts are this rank's."""
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def kv_destination(self) -> KVDestination:
        """This layer's KV-pool caches and the batch's slots, for a kernel that stores k/v itself
        (then `forward(..., kv_stored=True)`). Under CUDA-graph capture `batch.out_loc` is the
        graph's static buffer, so each replay stores where its batch says."""
        backend, batch = _running()
        pool, i = backend.cfg.kv_pool, self.layer_id
        return KVDestination(pool.k_cache(i), pool.v_cache(i), batch.out_loc, pool.k_scale(i),
                             pool.v_scale(i))

    def fuses_rope(self) -> bool:
        """Whether the running batch's backend rotates and stores the new token in its attention
        launch (decode on the Triton kernels): then `forward(..., rope=...)` gets q/k unrotated."""
        backend, batch = _running()
        return backend.fuses_rope(batch)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_stored: bool = False,
        out: torch.Tensor | None = None, rope: RopeParams | None = None,
    ) -> torch.Tensor:
        """q [T, Hq*D], k/v [T, Hkv*D] -> [T, Hq*D]. `kv_stored`: k/v are already at
        `kv_destination()`, so the backend only attends. `out`: a contiguous [T, Hq*D] buffer
        for the result (what a prefill graph's next piece reads). `rope` (where `fuses_rope`):
        q/k come unrotated, and the backend's kernel norms, rotates and stores them."""
        backend, batch = _running()
        if batch.kv_ready is not None:  # this layer's KV loaded from the host tier, first
            batch.kv_ready.wait(self.layer_id)
        t, d = q.shape[0], self.head_dim
        q3 = q.view(t, self.num_heads, d)
        k3, v3 = k.view(t, self.num_kv_heads, d), v.view(t, self.num_kv_heads, d)
        heads_out = None if out is None else out.view(t, self.num_heads, d)
        if rope is not None:
            new = NewTokenKV(k3, v3, batch.out_loc, rope)
            o = backend.attend_new_token(q3, new, self.layer_id, batch, heads_out)
        else:
            kv = (None, None) if kv_stored else (k3, v3)
            o = backend.forward(q3, *kv, self.layer_id, batch, heads_out)
        return o.reshape(t, self.num_heads * d)
