"""LoRA on a linear layer: the adapter slots' weights of one layer, stacked (`LinearLoRA`), and
the update of each token by its request's adapter, added to the layer's output.

A fused layer holds several projections (qkv: q, k, v; gate-up: gate, up), each with its own A
and B; so does its stack: `a` [S, P*R, in] holds projection p's A in rows p*R .. p*R+r, and
`b` [S, out, R] its B (scaling folded in) in that projection's output rows. This rank's shard,
as the layer's own weight is cut: a column-parallel layer's B by output rows (a projection's
rows as the layer keeps them, KV heads replicated where it replicates them), a row-parallel
layer's A by input columns; the other matrix whole. A row-parallel layer adds the update before
its all-reduce: each rank's x @ A.T is its share of the whole, so the sum is the update's."""
from __future__ import annotations

import torch

from radixserve.core.context import get_context
from radixserve.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixserve.layers.utils import copy_shard
from radixserve.utils import kernel_path
from radixserve_kernels import (
    lora_expand_,
    lora_expand_ref,
    lora_gemv,
    lora_shrink,
    lora_shrink_ref,
    silu_mul_gemv,
    skinny_gemm,
)

LoRATarget = QKVParallelLinear | MergedColumnParallelLinear | RowParallelLinear


def lora_parts(layer: LoRATarget) -> tuple[object, ...]:
    """The projections fused in `layer`, by the shard ids its weight loader takes."""
    if isinstance(layer, QKVParallelLinear):
        return ("q", "k", "v")
    if isinstance(layer, MergedColumnParallelLinear):
        return tuple(range(len(layer.out_local)))
    return (None,)


def full_shape(layer: LoRATarget, part: object) -> tuple[int, int]:
    """(out, in) of projection `part` of `layer` whole, as the checkpoint holds it (and so an
    adapter's B and A: [out, r] and [r, in])."""
    tp, (out_local, in_local) = layer.tp.size, layer.weight.shape
    if isinstance(layer, RowParallelLinear):
        return out_local, in_local * tp
    _, rows, _ = layer.part_rows(part)
    if part in ("k", "v"):
        return layer.total_kv_heads * layer.head_dim, in_local
    return rows * tp, in_local


class LinearLoRA:
    """The weights of `num_slots` adapter slots for one layer (zeros: an empty slot, or an
    adapter that leaves a projection out), in the layer's dtype and on its device."""

    def __init__(self, layer: LoRATarget, num_slots: int, max_rank: int,
                 dtype: torch.dtype) -> None:
        """`dtype`: the activations' (the model's; an FP8 weight's layer computes in it too)."""
        self.layer, self.rank = layer, max_rank
        self.parts = lora_parts(layer)
        w = layer.weight
        out_local, in_local = w.shape
        self.a = torch.zeros(num_slots, len(self.parts) * max_rank, in_local, dtype=dtype,
                             device=w.device)
        self.b = torch.zeros(num_slots, out_local, max_rank, dtype=dtype, device=w.device)
        self.bounds = (0, out_local) if self.parts == (None,) else tuple(
            [0] + [sum(layer.part_rows(p)[:2]) for p in self.parts])

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()

    def load(self, slot: int, part: object, a: torch.Tensor, b: torch.Tensor) -> None:
        """Projection `part` of an adapter into `slot`: this rank's shard of its whole A [r, in]
        and B [out, r] (scaling folded in)."""
        r, layer = a.shape[0], self.layer
        j = self.parts.index(part)
        dst_a = self.a[slot, j * self.rank : j * self.rank + r]
        dst_b = self.b[slot, :, :r]
        if isinstance(layer, RowParallelLinear):
            copy_shard(dst_a, a, 1, layer.tp.rank, dst_a.shape[1])
            dst_b.copy_(b)
            return
        dst_a.copy_(a)
        offset, rows, index = layer.part_rows(part)
        copy_shard(dst_b.narrow(0, offset, rows), b, 0, index, rows)

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether `gemv` takes x: one 16-bit row on the kernel path and a 16-bit weight (decode
        at batch 1, where the step is a chain of launches and each one saved counts)."""
        return (x.dim() == 2 and x.shape[0] == 1 and x.dtype != torch.float32
                and self.layer.weight_scale is None and kernel_path.use_triton(x))

    def gemv(self, x: torch.Tensor, bias: torch.Tensor | None, gated: bool = False,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's product for x (`fuses(x)`) with the row's adapter update: the shrink, then
        one launch for the product and the expand (`lora_gemv`). `gated`: x is [gate | up] and
        the input silu(gate) * up. A batch of the base model only takes the plain GEMV."""
        batch = get_context().batch
        groups = batch.lora if batch is not None else None
        w = self.layer.weight
        if groups is not None:
            return lora_gemv(x, w, bias, self.a, self.b, groups, self.bounds, gated, out)
        y = silu_mul_gemv(x, w, bias) if gated else skinny_gemm(x, w, bias)
        return y if out is None else out.copy_(y)

    def add_to(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (the layer's output for x) plus each adapter token's update, in place; a batch of
        base-model requests only carries no groups and is left as it is."""
        batch = get_context().batch
        groups = batch.lora if batch is not None else None
        if groups is None:
            return y
        if kernel_path.use_triton(x):
            return lora_expand_(y, lora_shrink(x, self.a, groups), self.b, groups, self.bounds)
        return lora_expand_ref(y, lora_shrink_ref(x, self.a, groups), self.b, groups, self.bounds)

