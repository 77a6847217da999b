from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, x_s0, n_inter, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_inter
    tl.store(out_ptr + row * n_inter + cols, gated_row(x_ptr + row * x_s0, n_inter, cols, mask),
             mask=mask)


@triton.jit
def gated_row(x_ptr, n_inter, cols, mask):
    """silu(gate) * up at `cols` of a row x = [gate | up] (2 * n_inter wide), in x's dtype,
    rounded as eager torch rounds between the ops, so bf16 results match the reference bit for
    bit (the one-row projections that compute their input this way give the same bits)."""
    gate = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + n_inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
    return (act * up).to(x_ptr.dtype.element_ty)
