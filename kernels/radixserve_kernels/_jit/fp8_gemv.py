from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit
def fp8_gemm_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, s_xm, s_wn, s_ym, s_sn,
    SCALE_N: tl.constexpr, GROUP_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # a [BLOCK_N, K] slab of the FP8 weight, widened to x's dtype in registers (e4m3 values are
    # exact in bf16/fp16/fp32), each BLOCK_K slice's product scaled in float32 by its group's
    # scale (BLOCK_K divides GROUP_K); GROUP_K == 0: one scale per row, applied once at the end
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    kk = tl.arange(0, BLOCK_K)
    nm, mm = n < N, m < M
    s_row = s_ptr + (n // SCALE_N).to(tl.int64) * s_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + kk) < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * s_wn + (k0 + kk)[None, :],
                    mask=nm[:, None] & km[None, :], other=0.0)
        x = tl.load(x_ptr + m[:, None].to(tl.int64) * s_xm + (k0 + kk)[None, :],
                    mask=mm[:, None] & km[None, :], other=0.0)
        part = tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=PRECISION)
        if GROUP_K > 0:
            acc += part * tl.load(s_row + k0 // GROUP_K, mask=nm, other=0.0)[None, :]
        else:
            acc += part
    if GROUP_K == 0:
        acc *= tl.load(s_row, mask=nm, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + m[:, None].to(tl.int64) * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mm[:, None] & nm[None, :])


@triton.jit
def fp8_gemv_kernel(
    x_ptr, w, s_ptr, b_ptr, y_ptr, N, K, s_wn, s_sn,
    SCALE_N: tl.constexpr, GROUP_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, TILE_K: tl.constexpr, STAGES: tl.constexpr,
    TMA: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # one row of x, no tensor cores: a program's [BLOCK_N, GROUPS * TILE_K] tile is held as
    # GROUPS slices of TILE_K columns (TILE_K divides GROUP_K), so each slice takes its scale
    # from one load per row and the products are summed in float32 once, at the end. The loop
    # is software-pipelined STAGES deep: with TMA (`w` a tensor descriptor) the weight tiles
    # stream into shared memory while earlier ones are widened, else by cp.async from `w`'s
    # pointer; either way no registers hold the bytes in flight
    n0 = tl.program_id(0) * BLOCK_N
    n = n0 + tl.arange(0, BLOCK_N)
    g = tl.arange(0, GROUPS)
    j = tl.arange(0, TILE_K)
    nm = n < N
    s_row = s_ptr + (n // SCALE_N).to(tl.int64) * s_sn
    acc = tl.zeros((BLOCK_N, GROUPS, TILE_K), dtype=tl.float32)
    for k0 in tl.range(0, K, GROUPS * TILE_K, num_stages=STAGES):
        kg = k0 + g * TILE_K  # first column of each slice
        col = kg[:, None] + j[None, :]  # [GROUPS, TILE_K]
        km = col < K
        if TMA:  # rows and columns past the weight's edge read as zeros
            wt = w.load([n0, k0]).reshape(BLOCK_N, GROUPS, TILE_K).to(tl.float32)
        else:
            wt = tl.load(w + n.to(tl.int64)[:, None, None] * s_wn + col[None, :, :],
                         mask=nm[:, None, None] & km[None, :, :], other=0.0).to(tl.float32)
        x = tl.load(x_ptr + col, mask=km, other=0.0).to(tl.float32)
        if GROUP_K > 0 and SCALE_N % BLOCK_N == 0:
            # the program's rows share their scales (programs never straddle a block's rows):
            # x is scaled once per column rather than every product once
            s = tl.load(s_ptr + (n0 // SCALE_N).to(tl.int64) * s_sn + kg // GROUP_K,
                        mask=kg < K, other=0.0)
            acc += wt * (x * s[:, None])[None, :, :]
        elif GROUP_K > 0:
            s = tl.load(s_row[:, None] + (kg // GROUP_K)[None, :],
                        mask=nm[:, None] & (kg < K)[None, :], other=0.0)
            acc += wt * x[None, :, :] * s[:, :, None]
        else:
            acc += wt * x[None, :, :]
    y = tl.sum(tl.sum(acc, 2), 1)
    if GROUP_K == 0:
        y *= tl.load(s_row, mask=nm, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=nm)
