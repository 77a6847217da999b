from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.activation import gated_row
from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit
def lora_gemm_kernel(
    in_ptr, w_ptr, out_ptr, order_ptr, starts_ptr, counts_ptr, num_slots,
    N, K, K_SPLIT, in_s0, in_plane_s, w_s0, w_s1, out_s0, out_split_s, end0, end1, part_cols,
    SPLITS: tl.constexpr, IN_PLANES: tl.constexpr, NUM_PARTS: tl.constexpr,
    ACCUMULATE: tl.constexpr, GATED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[row, n] (+)= in[row, p * part_cols + k] . w[slot, n, k] over k, for one tile of
    tokens (program axis 0: up to BLOCK_M tokens of one slot, the slots' tiles numbered in slot
    order), one block of outputs and one split of K (axis 1). The grid has as many tiles as the
    batch could need; the programs past the tiles it has return at once.
    Output n belongs to projection p: [0, end0), [end0, end1), [end1, N).
    SPLITS > 1: each split writes its own partial plane (out + split * out_split_s).
    IN_PLANES > 1: the input is that many partial planes (in + plane * in_plane_s), summed as
    they load (the shrink's splits, reduced by the expand that reads them: no launch between).
    GATED: each input row is [gate | up] of 2K, and the input silu(gate) * up (a gated MLP's
    down projection, whose activation its one-row GEMV computes too).
    PDL: launched early behind the kernel before it (`pdl_enter`), as the decode path's GEMVs
    are: a LoRA layer adds two kernels to each projection of a decode step."""
    pdl_enter(PDL)
    tile = tl.program_id(0)
    # which slot's tokens the tile holds, and which of its tiles it is: a scan of the counts
    slot = tl.full([], -1, tl.int32)
    local = tl.full([], 0, tl.int32)
    first = tl.full([], 0, tl.int32)
    for s in range(num_slots):
        tiles = (tl.load(counts_ptr + s) + BLOCK_M - 1) // BLOCK_M
        hit = (slot < 0) & (tile < first + tiles)
        slot = tl.where(hit, s, slot)
        local = tl.where(hit, tile - first, local)
        first += tiles
    if slot < 0:
        return
    count = tl.load(counts_ptr + slot) - local * BLOCK_M
    pid_n = tl.program_id(1) // SPLITS
    split = tl.program_id(1) % SPLITS
    m = tl.arange(0, BLOCK_M)
    mm = m < count
    start = tl.load(starts_ptr + slot) + local * BLOCK_M
    rows = tl.load(order_ptr + start + m, mask=mm, other=0).to(tl.int64)
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
                x_ptrs = in_ptr + rows[:, None] * in_s0 + (p * part_cols + k0 + kk)[None, :]
                xm = mm[:, None] & km[None, :]
                w = tl.load(w_base + n[None, :] * w_s1 + (k0 + kk)[:, None],
                            mask=km[:, None] & pm[None, :], other=0.0)
                if GATED:
                    x = gated_row(in_ptr + rows[:, None] * in_s0, K, (k0 + kk)[None, :], xm)
                elif IN_PLANES == 1:
                    x = tl.load(x_ptrs, mask=xm, other=0.0)
                else:
                    xs = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
                    for plane in range(IN_PLANES):
                        xs += tl.load(x_ptrs + plane * in_plane_s, mask=xm, other=0.0)
                    x = xs.to(w.dtype)
                acc += tl.dot(x, w, input_precision=PRECISION)
    out = out_ptr + split * out_split_s + rows[:, None] * out_s0 + n[None, :]
    om = mm[:, None] & nm[None, :]
    if ACCUMULATE:
        acc += tl.load(out, mask=om, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=om)
