"""Sparse mixture-of-experts block (Qwen3-MoE): a replicated router, softmax top-k, and experts
stored fused — `w13` [E, 2*I_local, H] (gate rows then up rows) and `w2` [E, H, I_local] — sharded
on the intermediate dim, so each rank computes a partial sum that an all-reduce completes."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.distributed import get_comm, get_tp_info
from radixserve.layers.linear import ReplicatedLinear
from radixserve.layers.utils import copy_shard, divide, new_param
from radixserve.utils import kernel_path
from radixserve.utils.registry import Registry
from radixserve_kernels import fused_moe, topk_softmax, topk_softmax_ref

FusedMoEFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
MOE_BACKENDS: Registry[FusedMoEFn] = Registry("MoE backend")
# grouped GEMMs over expert-sorted (token, expert) pairs; CUDA graph capturable, unlike "torch"
MOE_BACKENDS.register("triton")(fused_moe)


@MOE_BACKENDS.register("torch")
def torch_fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """x [T, H], topk_weights/topk_ids [T, k] -> sum_j topk_weights[t, j] * expert_{ids[t, j]}(x[t]).
    Tokens are grouped by expert so each expert runs one matmul pair (the counts go through the
    host: not CUDA-graph capturable)."""
    k = topk_ids.shape[1]
    flat_ids = topk_ids.flatten()
    order = flat_ids.argsort(stable=True)
    token_of = order // k
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    xs = x[token_of]
    ys = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts):
        if n:
            gate, up = F.linear(xs[start : start + n], w13[e]).chunk(2, dim=-1)
            ys[start : start + n] = F.linear(F.silu(gate) * up, w2[e])
            start += n
    ys *= topk_weights.flatten()[order, None].to(ys.dtype)
    return torch.zeros_like(x).index_add_(0, token_of, ys)


def select_experts(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [T, k] in the logits' dtype, topk_ids [T, k] int32) as transformers routes:
    softmax in float32, top-k, optional renormalisation."""
    fn = topk_softmax if kernel_path.use_triton(router_logits) else topk_softmax_ref
    weights, ids = fn(router_logits, top_k, norm_topk_prob)
    return weights.to(router_logits.dtype), ids


class FusedMoE(nn.Module):
    """The experts' weights. `shard_id` for loading: (expert, 0) gate, (expert, 1) up, (expert, 2) down."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.tp = get_tp_info()
        self.num_experts = num_experts
        self.inter_local = divide(intermediate, self.tp.size, "moe_intermediate_size")
        self.w13 = new_param(num_experts, 2 * self.inter_local, hidden)
        self.w2 = new_param(num_experts, hidden, self.inter_local)

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        assert isinstance(shard_id, tuple), "expert weights need (expert, 0|1|2) as shard_id"
        expert, which = shard_id
        n, r = self.inter_local, self.tp.rank
        if which == 2:
            copy_shard(param.data[expert], full, 1, r, n)
        else:
            copy_shard(param.data[expert, which * n : (which + 1) * n], full, 0, r, n)

    def shard_ids(self, param_name: str) -> tuple[object, ...]:
        parts = (0, 1) if param_name == "w13" else (2,)
        return tuple((e, p) for e in range(self.num_experts) for p in parts)


class SparseMoeBlock(nn.Module):
    def __init__(
        self, hidden: int, intermediate: int, num_experts: int, top_k: int, norm_topk_prob: bool
    ) -> None:
        super().__init__()
        self.tp = get_tp_info()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = ReplicatedLinear(hidden, num_experts)
        self.experts = FusedMoE(num_experts, hidden, intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = select_experts(self.gate(x), self.top_k, self.norm_topk_prob)
        out = MOE_BACKENDS.get(self._backend(x))(
            x, self.experts.w13, self.experts.w2, topk_weights, topk_ids
        )
        return get_comm().all_reduce(out) if self.tp.size > 1 else out

    @staticmethod
    def _backend(x: torch.Tensor) -> str:
        return "triton" if kernel_path.use_triton(x) else "torch"
