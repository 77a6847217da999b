from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softmax_step(s, m_i, l_i, AXIS: tl.constexpr):
    """Fold a block's scores `s` (keys along `AXIS`, the last axis) into the running max `m_i`
    and sum `l_i`: returns (new max, the factor that rescales the old output, the block's
    probabilities, new sum). A row with no key yet (max -inf) keeps zeros, not NaN: a slice of
    the sliced decode kernel can see only masked keys."""
    m_new = tl.maximum(m_i, tl.max(s, AXIS))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - tl.expand_dims(m_safe, AXIS))
    return m_new, alpha, p, l_i * alpha + tl.sum(p, AXIS)


@triton.jit
def attend_block(
    q, m_i, l_i, acc, k_ptr, v_ptr, table_ptr, row, table_s0, k_s0, k_s1, v_s0, v_s1, kvh,
    offs, nm, keep, d, dm, scale, PRECISION: tl.constexpr,
):
    """One block of keys of the online softmax, shared by the decode and extend kernels: gather
    the block's K and V through the page table (`offs` token positions, `nm` in range), score q
    against K (`keep` masks scores), and fold the block into the running max `m_i`, sum `l_i` and
    output `acc`. Returns the updated (m_i, l_i, acc).

    K and V are read in the cache's dtype and widened to q's (exact, also from FP8); an FP8
    cache's scales are not applied here: the caller folds the K scale into `scale` and multiplies
    the output by the V scale, the same numbers at a fraction of the multiplies."""
    slots = tl.load(table_ptr + row * table_s0 + offs, mask=nm, other=0).to(tl.int64)
    kv_mask = nm[:, None] & dm[None, :]
    k = tl.load(k_ptr + slots[:, None] * k_s0 + kvh * k_s1 + d[None, :], mask=kv_mask, other=0.0)
    k = k.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    s = tl.where(keep, s, float("-inf"))
    m_new, alpha, p, l_i = softmax_step(s, m_i, l_i, 1)
    v = tl.load(v_ptr + slots[:, None] * v_s0 + kvh * v_s1 + d[None, :], mask=kv_mask, other=0.0)
    v = v.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
