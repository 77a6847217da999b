from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit
def rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    x_s0, x_s1, res_s0, res_s1, n_inner, n_cols, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # rows are (outer, inner) pairs so a strided [T, H, D] view (q of a fused QKV) needs no copy
    row = tl.program_id(0).to(tl.int64)
    outer, inner = row // n_inner, row % n_inner
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + outer * x_s0 + inner * x_s1 + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + outer * res_s0 + inner * res_s1 + cols, mask=mask, other=0.0)
        # the sum is rounded to the model dtype first, as the HF residual stream is
        x = (x + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
        x = x.to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)
