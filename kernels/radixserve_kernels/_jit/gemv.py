from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.activation import gated_row
from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit
def skinny_gemm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, s_xm, s_wn, s_ym,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # one program streams a [BLOCK_N, K] slab of the weight once for all (few) rows of x
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    kk = tl.arange(0, BLOCK_K)
    nm, mm = n < N, m < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + kk) < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * s_wn + (k0 + kk)[None, :],
                    mask=nm[:, None] & km[None, :], other=0.0)
        x = tl.load(x_ptr + m[:, None] * s_xm + (k0 + kk)[None, :],
                    mask=mm[:, None] & km[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + m[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mm[:, None] & nm[None, :])


@triton.jit
def gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, K, s_wn,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # one row of x: no tensor-core tile to fill, so a program takes as few as 4 weight rows and
    # many programs keep every SM streaming; products summed in float32 once, at the end
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    nm = n < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + kk) < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * s_wn + (k0 + kk)[None, :],
                    mask=nm[:, None] & km[None, :], other=0.0)
        if GATED:  # x = [gate | up] of 2K: silu(gate) * up, rounded as silu_and_mul_kernel rounds
            x = gated_row(x_ptr, K, k0 + kk, km)
        else:
            x = tl.load(x_ptr + k0 + kk, mask=km, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=nm)
