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
    v_ptr, lb_ptr, slot_ptr, v_plane_s, lb_s0, end0, end1, rank,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    LORA: tl.constexpr, PLANES: tl.constexpr, BLOCK_R: tl.constexpr, PDL: tl.constexpr,
):
    """y = x . W[n] (+ b[n]) for one row x. LORA: plus the row's adapter update
    v[p(n)*rank : (p(n)+1)*rank] . lb[slot, n] (the expand of `lora_expand_`, whose input v is
    the shrink's PLANES partial planes, summed here; p(n) the projection output n belongs to:
    [0, end0), [end0, end1), [end1, N)), added to the base product rounded to y's dtype as the
    expand adds it to y; slot -1 (the base model) adds nothing."""
    pdl_enter(PDL)
    # one row of x: no tensor-core tile to fill, so a program takes as few as 4 weight rows and
    # many programs keep every SM streaming; products summed in float32 once, at the end
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    nm = n < N
    if LORA:  # (its few loads issued ahead of the weight stream, their latency hidden behind it)
        delta = tl.zeros((BLOCK_N,), dtype=tl.float32)
        slot = tl.load(slot_ptr)
        if slot >= 0:
            r = tl.arange(0, BLOCK_R)
            rm = nm[:, None] & (r < rank)[None, :]
            part = (n >= end0).to(tl.int32) + (n >= end1).to(tl.int32)
            v_ptrs = v_ptr + (part * rank)[:, None] + r[None, :]
            vs = tl.zeros((BLOCK_N, BLOCK_R), dtype=tl.float32)
            for plane in range(PLANES):
                vs += tl.load(v_ptrs + plane * v_plane_s, mask=rm, other=0.0).to(tl.float32)
            bw = tl.load(lb_ptr + slot.to(tl.int64) * lb_s0 + n[:, None] * rank + r[None, :],
                         mask=rm, other=0.0)
            # v rounded to the weights' dtype as the expand's tensor-core input is
            delta = tl.sum(vs.to(bw.dtype).to(tl.float32) * bw.to(tl.float32), 1)
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
    if LORA:
        y = y.to(y_ptr.dtype.element_ty).to(tl.float32) + delta
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=nm)
