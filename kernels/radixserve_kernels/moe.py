"""Qwen3-MoE: top-k softmax routing and the expert MLPs as grouped GEMMs over (token, expert)
pairs sorted by expert, gate/up SiLU-and-mul fused into the first GEMM."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve_kernels._utils import cdiv, dot_precision, next_pow2


def topk_softmax_ref(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int32), as transformers'
    Qwen3-MoE router (softmax in fp32, top-k, optional renormalisation)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def fused_moe_ref(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """x [T, H], w13 [E, 2I, H] (gate rows then up rows), w2 [E, H, I] -> [T, H]."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        tok, slot = torch.where(topk_ids == e)
        gate, up = F.linear(x[tok], w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e]) * topk_weights[tok, slot, None].to(x.dtype)
        out.index_add_(0, tok, y.float())
    return out.to(x.dtype)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """Sort (token, slot) pairs by expert, each expert's run padded to a multiple of block_m.
    Returns (sorted pair ids [cap] padded with T*k, expert of each block [cap // block_m],
    number of padded pairs [1]); all on device, no host sync (cap is an upper bound)."""
    flat = topk_ids.flatten().long()
    num_pairs = flat.numel()
    cap = num_pairs + num_experts * (block_m - 1)
    cap = cdiv(cap, block_m) * block_m
    # NOTE: not torch.bincount, which reads the ids' min and max on the host under CUDA (a sync
    # that breaks CUDA-graph capture)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    sorted_ids = torch.full((cap,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[starts[expert_of] + rank] = order.to(torch.int32)
    block_start = torch.arange(0, cap, block_m, device=flat.device)
    block_expert = torch.searchsorted(ends, block_start, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, block_expert.to(torch.int32), ends[-1:].to(torch.int32)


def topk_softmax(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `topk_softmax_ref` (ties go to the lower expert id)."""
    from radixserve_kernels._jit.moe import topk_softmax_kernel

    t, n_experts = router_logits.shape
    weights = torch.empty(t, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=router_logits.device)
    if t:
        topk_softmax_kernel[(t,)](
            router_logits, weights, ids, router_logits.stride(0), n_experts,
            TOP_K=top_k, NORMALIZE=norm_topk_prob, BLOCK_E=next_pow2(n_experts), num_warps=1,
        )
    return weights, ids


def _gemm(a, b, c, weights, align, n, k, a_row_div, gated, mul_weight, block_m):
    from radixserve_kernels._jit.moe import moe_gemm_kernel

    sorted_ids, block_expert, num_padded = align
    block_n, block_k = (64, 64) if c.dtype != torch.float32 else (32, 32)
    grid = (sorted_ids.numel() // block_m, cdiv(n, block_n))
    moe_gemm_kernel[grid](
        a, b, c, weights, sorted_ids, block_expert, num_padded,
        n, k, c.shape[0], a.stride(0), b.stride(0), b.stride(1), c.stride(0),
        A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=mul_weight,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=dot_precision(c.dtype),
        num_warps=4, num_stages=3,
    )


def fused_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Triton twin of `fused_moe_ref`: two grouped GEMMs (gate/up with SiLU-and-mul inside, then
    down scaled by the routing weight) and a sum over each token's k experts."""
    t, hidden = x.shape
    n_experts, two_inter, _ = w13.shape
    inter, top_k = two_inter // 2, topk_ids.shape[1]
    if t == 0:
        return torch.empty_like(x)
    x = x.contiguous()
    block_m = 16 if t * top_k <= 4 * n_experts else 64
    align = moe_align(topk_ids, n_experts, block_m)
    act = torch.empty(t * top_k, inter, dtype=x.dtype, device=x.device)
    _gemm(x, w13, act, topk_weights, align, inter, hidden, top_k, True, False, block_m)
    down = torch.empty(t * top_k, hidden, dtype=x.dtype, device=x.device)
    _gemm(act, w2, down, topk_weights.contiguous(), align, hidden, inter, 1, False, True, block_m)
    return down.view(t, top_k, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)
