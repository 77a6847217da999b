from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lora_gemm_kernel(
    in_ptr, w_ptr, out_ptr, order_ptr, starts_ptr, counts_ptr,
    N, K, K_SPLIT, in_s0, w_s0, w_s1, out_s0, out_split_s, end0, end1, part_cols,
    SPLITS: tl.constexpr, NUM_PARTS: tl.constexpr, ACCUMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    """out[row, n] (+)= in[row, p * part_cols + k] . w[slot, n, k] over k, for the tokens of one
    slot (program axis 2) and one block of them (axis 0), one block of outputs and one split of
    K (axis 1). Output n belongs to projection p: [0, end0), [end0, end1), [end1, N).
    SPLITS > 1: each split writes its own partial plane (out + split * out_split_s)."""
    pid_m = tl.program_id(0)
    slot = tl.program_id(2)
    count = tl.load(counts_ptr + slot)
    if pid_m * BLOCK_M >= count:
        return
    pid_n = tl.program_id(1) // SPLITS
    split = tl.program_id(1) % SPLITS
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = m < count
    rows = tl.load(order_ptr + tl.load(starts_ptr + slot) + m, mask=mm, other=0).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    kk = tl.arange(0, BLOCK_K)
    w_base = w_ptr + slot.to(tl.int64) * w_s0
    k_lo = split * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    n_lo = pid_n * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for p in tl.static_range(NUM_PARTS):
        lo = 0 if p == 0 else (end0 if p == 1 else end1)
        hi = N if p == NUM_PARTS - 1 else (end0 if p == 0 else end1)
        if (n_lo < hi) & (n_lo + BLOCK_N > lo):  # this block holds outputs of projection p
            pm = nm & (n >= lo) & (n < hi)
            for k0 in range(k_lo, k_hi, BLOCK_K):
                km = k0 + kk < k_hi
                x = tl.load(in_ptr + rows[:, None] * in_s0 + (p * part_cols + k0 + kk)[None, :],
                            mask=mm[:, None] & km[None, :], other=0.0)
                w = tl.load(w_base + n[None, :] * w_s1 + (k0 + kk)[:, None],
                            mask=km[:, None] & pm[None, :], other=0.0)
                acc += tl.dot(x, w, input_precision=PRECISION)
    out = out_ptr + split * out_split_s + rows[:, None] * out_s0 + n[None, :]
    om = mm[:, None] & nm[None, :]
    if ACCUMULATE:
        acc += tl.load(out, mask=om, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=om)
