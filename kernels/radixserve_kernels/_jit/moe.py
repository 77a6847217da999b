from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def topk_softmax_kernel(
    logits_ptr, w_ptr, ids_ptr, logits_s0, n_experts,
    TOP_K: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    x = tl.load(logits_ptr + t * logits_s0 + e, mask=e < n_experts, other=float("-inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = p / tl.sum(p, 0)
    total = 0.0
    for i in tl.static_range(TOP_K):
        best = tl.max(p, 0)
        # lowest index among ties, like torch.topk on CPU and CUDA in practice
        idx = tl.min(tl.where(p == best, e, BLOCK_E), 0)
        tl.store(w_ptr + t * TOP_K + i, best)
        tl.store(ids_ptr + t * TOP_K + i, idx)
        total += best
        p = tl.where(e == idx, -1.0, p)
    if NORMALIZE:
        for i in tl.static_range(TOP_K):
            w = tl.load(w_ptr + t * TOP_K + i)
            tl.store(w_ptr + t * TOP_K + i, w / total)


@triton.jit
def moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
    N, K, num_pairs, a_s0, b_s0, b_s1, c_s0,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    """C[pair] = A[pair // A_ROW_DIV] @ B[expert].T for one block of (token, expert) pairs that
    all share one expert. GATED: B rows [0, N) are gate, [N, 2N) up; C gets silu(gate) * up.
    MUL_WEIGHT: C is scaled by the pair's routing weight."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    pm = pairs < num_pairs
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = pairs // A_ROW_DIV
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    kk = tl.arange(0, BLOCK_K)
    b_base = b_ptr + expert * b_s0
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = k0 + kk < K
        a = tl.load(a_ptr + rows[:, None] * a_s0 + (k0 + kk)[None, :],
                    mask=pm[:, None] & km[None, :], other=0.0)
        b = tl.load(b_base + n[None, :] * b_s1 + (k0 + kk)[:, None],
                    mask=km[:, None] & nm[None, :], other=0.0)
        acc += tl.dot(a, b, input_precision=PRECISION)
        if GATED:
            bu = tl.load(b_base + (n + N)[None, :] * b_s1 + (k0 + kk)[:, None],
                         mask=km[:, None] & nm[None, :], other=0.0)
            acc_up += tl.dot(a, bu, input_precision=PRECISION)
    ty = c_ptr.dtype.element_ty
    # round between steps like the eager expert MLP (linear -> silu -> mul -> linear -> scale)
    out = acc.to(ty).to(tl.float32)
    if GATED:
        act = (out / (1.0 + tl.exp(-out))).to(ty).to(tl.float32)
        out = act * acc_up.to(ty).to(tl.float32)
    if MUL_WEIGHT:
        w = tl.load(topk_w_ptr + pairs, mask=pm, other=0.0).to(ty).to(tl.float32)
        out = out * w[:, None]
    tl.store(c_ptr + pairs[:, None] * c_s0 + n[None, :], out.to(ty), mask=pm[:, None] & nm[None, :])
