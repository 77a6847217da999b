"""Linear layers: replicated, column-parallel (output split), row-parallel (input split, summed
with an all-reduce), and the fused column-parallel QKV and gate+up projections. A layer served
with LoRA adapters carries their slots' weights in `lora` (`layers/lora.py`), whose update is
added to its output (a row-parallel layer's before the all-reduce, which sums it too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.distributed import get_comm, get_tp_info
from radixserve.layers.fp8_linear import fp8_linear
from radixserve.layers.lazy_weight import materialize
from radixserve.layers.utils import check_shape, copy_shard, divide, new_param
from radixserve.utils import kernel_path
from radixserve_kernels import SKINNY_MAX_M, silu_mul_gemv, skinny_gemm

if TYPE_CHECKING:
    from radixserve.layers.lora import LinearLoRA


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None,
           weight_scale: torch.Tensor | None = None,
           scale_block: tuple[int, int] | None = None) -> torch.Tensor:
    """`F.linear`, except that a few rows of a 16-bit activation on CUDA (decode at small batch)
    take the skinny Triton kernel, which streams the weight at a higher share of the bandwidth
    than cuBLAS picks there. float32 stays on cuBLAS: its results are the parity reference.
    `out` (x [T, in] only): a contiguous [T, out] buffer the product is written to.
    `weight_scale`: the weight is FP8 with these scales, one a row ([out]) or, with
    `scale_block` (rows, columns), one a block (`fp8_linear`)."""
    if weight_scale is not None:
        return fp8_linear(x, weight, weight_scale, bias, out, scale_block)
    if (x.dim() == 2 and x.shape[0] <= SKINNY_MAX_M and x.dtype != torch.float32
            and kernel_path.use_triton(x)):
        y = skinny_gemm(x, weight, bias)
        return y if out is None else out.copy_(y)
    if out is None:
        return F.linear(x, weight, bias)
    # cuBLAS writes the product straight into `out`: the same kernel F.linear picks
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


class _Linear(nn.Module):
    def __init__(self, in_local: int, out_local: int, bias: bool) -> None:
        super().__init__()
        self.weight = new_param(out_local, in_local)
        self.bias = new_param(out_local) if bias else None
        # an FP8 checkpoint's scales, where the weight stays FP8 (`to_fp8_linear`): one a row, or
        # one a block of `scale_block_n` rows (1 until `compact_block_scales`) and
        # `scale_block_k` input columns
        self.register_parameter("weight_scale", None)
        self.scale_block_k: int | None = None
        self.scale_block_n = 1
        self.lora: LinearLoRA | None = None  # the adapter slots' weights, when LoRA is on

    @property
    def scale_block(self) -> tuple[int, int] | None:
        """(rows, columns) a block scale covers; None: one scale a row, or no FP8 weight."""
        return None if self.scale_block_k is None else (self.scale_block_n, self.scale_block_k)

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.lora is not None and self.lora.fuses(x):
            return self.lora.gemv(x, self.bias, out=out)
        y = linear(x, self.weight, self.bias, out, self.weight_scale, self.scale_block)
        return y if self.lora is None else self.lora.add_to(x, y)


class ReplicatedLinear(_Linear):
    """The full weight on every rank."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias)

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        check_shape(param, full)
        param.data.copy_(materialize(full))


class ColumnParallelLinear(_Linear):
    """Output features split across ranks; each rank returns its slice (no communication)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        self.tp = get_tp_info()
        super().__init__(in_features, divide(out_features, self.tp.size, "out_features"), bias)

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        copy_shard(param.data, full, 0, self.tp.rank, param.shape[0])


class RowParallelLinear(_Linear):
    """Input features split across ranks; partial products are summed with an all-reduce. The bias
    is kept whole and added once, after the reduction."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        self.tp = get_tp_info()
        super().__init__(divide(in_features, self.tp.size, "in_features"), out_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp.size == 1 else None
        # (x @ A.T is this rank's share of the adapter's update too: summed with the rest)
        if self.lora is not None and self.lora.fuses(x):
            y = self.lora.gemv(x, bias)
        else:
            y = linear(x, self.weight, bias, weight_scale=self.weight_scale,
                       scale_block=self.scale_block)
            if self.lora is not None:
                y = self.lora.add_to(x, y)
        return y if self.tp.size == 1 else self._sum_ranks(y)

    def _sum_ranks(self, partial: torch.Tensor) -> torch.Tensor:
        """The ranks' partial products summed, plus the bias (kept whole, added once)."""
        y = get_comm().all_reduce(partial)
        return y if self.bias is None else y + self.bias

    def fuses_silu_mul(self, x: torch.Tensor) -> bool:
        """Whether `forward_silu_mul` takes x [T, 2 * in] in one launch: one 16-bit row on the
        kernel path with a 16-bit weight (decode at batch 1, where each launch saved counts)."""
        return (x.dim() == 2 and x.shape[0] == 1 and x.dtype != torch.float32
                and self.weight_scale is None and kernel_path.use_triton(x))

    def forward_silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """`forward(silu(gate) * up)` of x = [gate | up], where `fuses_silu_mul(x)` (with the
        adapters' update, whose shrink computes the activation too)."""
        bias = self.bias if self.tp.size == 1 else None
        y = (silu_mul_gemv(x, self.weight, bias) if self.lora is None
             else self.lora.gemv(x, bias, gated=True))
        return y if self.tp.size == 1 else self._sum_ranks(y)

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        # bias, or an FP8 weight_scale of one per output row (block scales: [out, in / block],
        # cut along their columns like the weight)
        if param.dim() == 1:
            check_shape(param, full)
            param.data.copy_(materialize(full))
        else:
            copy_shard(param.data, full, 1, self.tp.rank, param.shape[1])


class MergedColumnParallelLinear(_Linear):
    """Several column-parallel projections of one input in one matmul (gate+up): this rank's slice
    of each output, concatenated in order. `shard_id` is the index of the projection."""

    def __init__(self, in_features: int, out_features: list[int], bias: bool = False) -> None:
        self.tp = get_tp_info()
        self.out_local = [divide(o, self.tp.size, "out_features") for o in out_features]
        super().__init__(in_features, sum(self.out_local), bias)

    def part_rows(self, shard_id: object) -> tuple[int, int, int]:
        """Projection `shard_id`'s rows here: (offset, count, index of its block in the full
        projection)."""
        assert isinstance(shard_id, int), "merged linear needs the projection index as shard_id"
        return sum(self.out_local[:shard_id]), self.out_local[shard_id], self.tp.rank

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        offset, size, index = self.part_rows(shard_id)
        copy_shard(param.data.narrow(0, offset, size), full, 0, index, size)

    def shard_ids(self, param_name: str) -> tuple[object, ...]:
        return tuple(range(len(self.out_local)))


class QKVParallelLinear(_Linear):
    """q, k and v projections fused. Query heads are split across ranks; KV heads are split too, or
    replicated (rank r holds KV head r * num_kv_heads // tp) when there are fewer than ranks."""

    def __init__(
        self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool
    ) -> None:
        self.tp = get_tp_info()
        self.head_dim = head_dim
        self.total_kv_heads = num_kv_heads
        self.num_heads = divide(num_heads, self.tp.size, "num_attention_heads")
        if num_kv_heads >= self.tp.size:
            self.num_kv_heads = divide(num_kv_heads, self.tp.size, "num_key_value_heads")
            self.kv_index = self.tp.rank
        else:
            divide(self.tp.size, num_kv_heads, "tp size over num_key_value_heads")
            self.num_kv_heads = 1
            self.kv_index = self.tp.rank * num_kv_heads // self.tp.size
        q, kv = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.sizes = {"q": q, "k": kv, "v": kv}
        super().__init__(hidden, q + 2 * kv, bias)

    def part_rows(self, shard_id: object) -> tuple[int, int, int]:
        """Projection `shard_id`'s rows here: (offset, count, index of its block in the full
        projection)."""
        assert shard_id in self.sizes, "qkv linear needs shard_id q, k or v"
        offset = {"q": 0, "k": self.sizes["q"], "v": self.sizes["q"] + self.sizes["k"]}[shard_id]
        index = self.tp.rank if shard_id == "q" else self.kv_index
        return offset, self.sizes[shard_id], index

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        offset, size, index = self.part_rows(shard_id)
        copy_shard(param.data.narrow(0, offset, size), full, 0, index, size)

    def shard_ids(self, param_name: str) -> tuple[object, ...]:
        return ("q", "k", "v")

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return qkv.split([self.sizes["q"], self.sizes["k"], self.sizes["v"]], dim=-1)  # type: ignore[return-value]
