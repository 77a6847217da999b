from __future__ import annotations

import triton
import triton.language as tl

from radixserve_kernels._jit.pdl import pdl_enter


@triton.jit
def quantize_groups_fp8_kernel(
    x_ptr, q_ptr, s_ptr, M, K, s_xm, s_sg,
    GROUP: tl.constexpr, GROUPS: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # one row's GROUPS groups of GROUP columns a program; rows past M (padding for cuBLASLt)
    # quantize zeros: q 0, scale the floor
    m = tl.program_id(0)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    col = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    ok = (col < K) & (m < M)
    x = tl.load(x_ptr + m.to(tl.int64) * s_xm + col, mask=ok, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), 1), 448.0), 1e-12)
    q = tl.math.div_rn(x, scale[:, None])  # IEEE division, as the reference (`/` is approximate)
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    tl.store(q_ptr + m.to(tl.int64) * K + col, q.to(q_ptr.dtype.element_ty), mask=col < K)
    tl.store(s_ptr + g.to(tl.int64) * s_sg + m, scale, mask=g * GROUP < K)
