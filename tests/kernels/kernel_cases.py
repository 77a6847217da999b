"""Random paged-KV layouts shared by the kernel tests."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from radixserve_kernels.testing import enable_cpu_interpreter

if TYPE_CHECKING:  # kernel modules load only after the interpreter switch below
    from collections.abc import Callable

    from radixserve_kernels.decode_attention import DecodeShape

INTERPRETING = not torch.cuda.is_available() and enable_cpu_interpreter()

interpreter_only = pytest.mark.skipif(
    not INTERPRETING,
    reason="Triton interpreter tier: needs triton and no CUDA (the gpu tier covers CUDA)",
)


def case_id(value: object) -> str:
    """A short test id for a decode case's parameter: 32x2s for a shape of 32-key blocks over 2
    warps (s: sliced), 4-2 for 4 query heads over 2, dtypes by name."""
    from radixserve_kernels.decode_attention import DecodeShape

    if isinstance(value, DecodeShape):
        return f"{value.block_n}x{value.warps}{'s' if value.sliced else ''}d{value.stages}"
    if isinstance(value, tuple):
        return "-".join(map(str, value))
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return "kv-model" if value is None else str(value)


def paged_table(
    seq_lens: list[int], page_size: int, num_pages: int, max_len: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A page table whose rows hold each request's slots on randomly chosen whole pages, rows
    shuffled too. Returns (page_table [R, max_len] int32, req_rows [B] int64)."""
    rows = len(seq_lens) + 2
    table = torch.zeros(rows, max_len, dtype=torch.int32)
    pages = torch.randperm(num_pages, generator=gen)
    req_rows = torch.randperm(rows, generator=gen)[: len(seq_lens)]
    used = 0
    for row, n in zip(req_rows.tolist(), seq_lens):
        need = -(-n // page_size)
        assert used + need <= num_pages, "pool too small for the case"
        mine = pages[used:used + need]
        used += need
        slots = (mine[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
        table[row, :n] = slots.to(torch.int32)
    return table, req_rows


def kv_pool(num_pages: int, page_size: int, heads: int, dim: int, dtype: torch.dtype,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = ((num_pages + 1) * page_size, heads, dim)
    return (torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))


# ---- checks shared by the interpreter tier (CPU) and the gpu tier ---------------------------
# Tolerances: float32 kernels agree with the references to ~1e-5 (attention) / 1e-6 (elementwise).
# 16-bit results may differ by one unit in the last place (bf16: 2**-8 relative) where the kernel
# rounds a value the reference rounds differently (fused math, or the interpreter's truncating
# casts), so 16-bit comparisons allow 2 ulps.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol * scale)


def check_rmsnorm(dev: str, dtype: torch.dtype, rows: int, dim: int) -> None:
    from radixserve_kernels import (
        fused_add_rms_norm,
        fused_add_rms_norm_ref,
        rms_norm,
        rms_norm_ref,
    )

    gen = torch.Generator().manual_seed(rows * dim)
    x = torch.randn(rows, 3, dim, generator=gen).to(dtype).to(dev)
    res = torch.randn(rows, 3, dim, generator=gen).to(dtype).to(dev)
    w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype).to(dev)
    close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), dtype)
    strided = torch.randn(rows, 5, dim, generator=gen).to(dtype).to(dev)[:, 1:4]
    close(rms_norm(strided, w, 1e-6), rms_norm_ref(strided, w, 1e-6), dtype)
    out, new_res = fused_add_rms_norm(x, res, w, 1e-6)
    want_out, want_res = fused_add_rms_norm_ref(x, res, w, 1e-6)
    close(out, want_out, dtype)
    close(new_res, want_res, dtype)
    # into given buffers (a prefill graph's static outputs): written there, and returned
    for fn in (fused_add_rms_norm, fused_add_rms_norm_ref):
        buf, res_buf = torch.full_like(x, 9.0), torch.full_like(x, 9.0)
        got, got_res = fn(x, res, w, 1e-6, out=buf, residual_out=res_buf)
        assert got.data_ptr() == buf.data_ptr() and got_res.data_ptr() == res_buf.data_ptr()
        close(buf, want_out, dtype)
        close(res_buf, want_res, dtype)
    for fn in (rms_norm, rms_norm_ref):
        buf = torch.full_like(strided.contiguous(), 9.0)
        assert fn(strided, w, 1e-6, out=buf).data_ptr() == buf.data_ptr()
        close(buf, rms_norm_ref(strided, w, 1e-6), dtype)


def check_silu_and_mul(dev: str, dtype: torch.dtype, rows: int, inter: int) -> None:
    from radixserve_kernels import silu_and_mul, silu_and_mul_ref

    x = (torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 3).to(dtype).to(dev)
    close(silu_and_mul(x), silu_and_mul_ref(x), dtype, scale=10)


def check_argmax_rows(dev: str, dtype: torch.dtype, rows: int, cols: int, chunk: int) -> None:
    """Against torch.argmax: random rows, a tie between two chunks and inside one (the first
    column wins), a NaN (taken as the largest), rows all equal or all -inf, a strided view, and
    a vocab that is no multiple of the chunk."""
    from radixserve_kernels import argmax_rows, argmax_rows_ref

    gen = torch.Generator().manual_seed(cols)
    x = torch.randn(rows, cols, generator=gen).to(dtype)
    top = x.max() + 1
    x[0, [cols - 1, 2]] = top  # across chunks: column 2 first
    x[1, [chunk + 1, chunk + 5]] = top  # inside one chunk
    x[2, cols // 2] = float("nan")
    x[3] = 0.0
    x[4] = float("-inf")
    x = x.to(dev)
    got = argmax_rows(x, chunk=chunk)
    assert got.dtype == torch.int64
    assert torch.equal(got, argmax_rows_ref(x)), (got, argmax_rows_ref(x))
    assert got[:5].tolist() == [2, chunk + 1, cols // 2, 0, 0]
    wide = torch.randn(rows, 2 * cols, generator=gen).to(dtype).to(dev)[:, ::2]
    assert torch.equal(argmax_rows(wide, chunk=chunk), argmax_rows_ref(wide))
    with pytest.raises(ValueError, match="rows, cols"):
        argmax_rows(x[0], chunk=chunk)
    check_argmax_token_store(x, chunk)


def check_argmax_token_store(x: torch.Tensor, chunk: int) -> None:
    """With a TokenStore each pick also lands at pool[rows[i], min(cols[i], cap)], rows in any
    order, int32 or int64 columns, one column past the cap; every other cell keeps its value."""
    from radixserve_kernels import TokenStore, argmax_rows

    rows, dev = x.shape[0], x.device
    gen = torch.Generator().manual_seed(rows)
    pool = torch.randint(0, 1 << 40, (rows + 3, 9), generator=gen)
    table_rows = torch.randperm(rows + 3, generator=gen)[:rows]
    cols = torch.randint(0, 9, (rows,), generator=gen)
    cols[0] = 12  # past the cap (8): its token goes to column 8
    want_tokens = x.float().cpu().nan_to_num(nan=float("inf")).argmax(-1)
    want = pool.clone()
    for i in range(rows):
        want[table_rows[i], min(int(cols[i]), 8)] = want_tokens[i]
    for col_dtype in (torch.int32, torch.int64):
        got_pool = pool.to(dev)
        store = TokenStore(got_pool, table_rows.to(dev), cols.to(col_dtype).to(dev), 8)
        assert torch.equal(argmax_rows(x, store, chunk=chunk).cpu(), want_tokens)
        assert torch.equal(got_pool.cpu(), want)
    short = TokenStore(pool.to(dev), table_rows[:-1].to(dev), cols[:-1].to(dev), 8)
    with pytest.raises(ValueError, match="TokenStore"):
        argmax_rows(x, short, chunk=chunk)


def check_rotary(dev: str, dtype: torch.dtype, tokens: int, heads: tuple[int, int], dim: int,
                 inv_freq: torch.Tensor) -> None:
    from radixserve_kernels import apply_rotary_ref, build_cos_sin_cache, qk_norm_rope_

    gen = torch.Generator().manual_seed(tokens)
    hq, hk = heads
    cache = build_cos_sin_cache(inv_freq, 4096).to(dev)
    qkv = torch.randn(tokens, (hq + 2 * hk) * dim, generator=gen).to(dtype).to(dev)
    q = qkv[:, : hq * dim].view(tokens, hq, dim)  # strided views, as a fused QKV gives them
    k = qkv[:, hq * dim : (hq + hk) * dim].view(tokens, hk, dim)
    pos = torch.randint(0, 4096, (tokens,), generator=gen).to(dev)
    want_q, want_k = apply_rotary_ref(q, k, pos, cache)
    got_q, got_k = qk_norm_rope_(q, k, pos, cache, None, None, 0.0)  # rotary alone, in place
    close(got_q, want_q, dtype, scale=4)
    close(got_k, want_k, dtype, scale=4)


def check_qk_norm_rope(dev: str, dtype: torch.dtype, tokens: int, heads: tuple[int, int],
                       dim: int, inv_freq: torch.Tensor) -> None:
    """In place on strided views of a fused QKV; v (after k) must be left untouched."""
    from radixserve_kernels import build_cos_sin_cache, qk_norm_rope_, qk_norm_rope_ref

    gen = torch.Generator().manual_seed(tokens + dim)
    hq, hk = heads
    cache = build_cos_sin_cache(inv_freq, 4096).to(dev)
    pos = torch.randint(0, 4096, (tokens,), generator=gen).to(dev)
    qw = (1 + 0.3 * torch.randn(dim, generator=gen)).to(dtype).to(dev)
    kw = (1 + 0.3 * torch.randn(dim, generator=gen)).to(dtype).to(dev)
    for weights in ((qw, kw), (None, None)):
        qkv = (3 * torch.randn(tokens, (hq + 2 * hk) * dim, generator=gen)).to(dtype).to(dev)
        v_before = qkv[:, (hq + hk) * dim :].clone()
        q = qkv[:, : hq * dim].view(tokens, hq, dim)
        k = qkv[:, hq * dim : (hq + hk) * dim].view(tokens, hk, dim)
        want_q, want_k = qk_norm_rope_ref(q.clone(), k.clone(), pos, cache, *weights, 1e-6)
        got_q, got_k = qk_norm_rope_(q, k, pos, cache, *weights, 1e-6)
        assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
        close(q, want_q, dtype, scale=4)
        close(k, want_k, dtype, scale=4)
        assert torch.equal(qkv[:, (hq + hk) * dim :], v_before)


def check_qk_norm_rope_store_kv(dev: str, dtype: torch.dtype, tokens: int,
                                heads: tuple[int, int], dim: int, inv_freq: torch.Tensor,
                                cache_dtype: torch.dtype = torch.bfloat16) -> None:
    """The fused KV store: q/k rotated in place as without it, and the caches (bf16 or FP8 with
    `FP8_SCALES`, padded strides) hold exactly what `store_kv_ref` of the rotated k and of v
    writes at a shuffled out_loc; every other row unchanged."""
    from radixserve_kernels import (
        build_cos_sin_cache,
        qk_norm_rope_,
        qk_norm_rope_ref,
        store_kv_ref,
    )

    gen = torch.Generator().manual_seed(tokens * dim)
    hq, hk = heads
    cache = build_cos_sin_cache(inv_freq, 4096).to(dev)
    pos = torch.randint(0, 4096, (tokens,), generator=gen).to(dev)
    qw = (1 + 0.3 * torch.randn(dim, generator=gen)).to(dtype).to(dev)
    kw = (1 + 0.3 * torch.randn(dim, generator=gen)).to(dtype).to(dev)
    slots = 3 * tokens + 5
    k_cache = torch.randn(slots, hk, dim + 8, generator=gen).to(cache_dtype).to(dev)[..., :dim]
    v_cache = torch.randn(slots, hk + 1, dim, generator=gen).to(cache_dtype).to(dev)[:, 1:]
    fp8 = cache_dtype == torch.float8_e4m3fn
    scales = FP8_SCALES if fp8 else {}
    loc = torch.randperm(slots, generator=gen)[:tokens].to(dev)
    untouched = torch.ones(slots, dtype=torch.bool, device=dev)
    untouched[loc] = False
    kc_before, vc_before = k_cache.clone(), v_cache.clone()
    qkv = (3 * torch.randn(tokens, (hq + 2 * hk) * dim, generator=gen)).to(dtype).to(dev)
    q, k, v = (x.view(tokens, -1, dim) for x in qkv.split([hq * dim, hk * dim, hk * dim], dim=1))
    want_q, want_k = qk_norm_rope_ref(q.clone(), k.clone(), pos, cache, qw, kw, 1e-6)
    want_kc, want_vc = k_cache.clone(), v_cache.clone()
    store_kv_ref(want_kc, want_vc, want_k, v, loc, **scales)

    qk_norm_rope_(q, k, pos, cache, qw, kw, 1e-6, v=v, k_cache=k_cache, v_cache=v_cache,
                  out_loc=loc, **scales)
    close(q, want_q, dtype, scale=4)
    close(k, want_k, dtype, scale=4)
    if fp8:
        from radixserve_kernels import dequantize_kv_ref, quantize_kv_ref
        from radixserve_kernels.kv_quant import gather_kv

        # exactly the quantized k the kernel rotated in place (the reference's rotation may be
        # an ulp away, which FP8 rounding can turn into an FP8 ulp), and the quantized v
        assert torch.equal(fp8_bits(k_cache)[loc], fp8_bits(quantize_kv_ref(k, cache_dtype, 0.3)))
        assert torch.equal(fp8_bits(v_cache)[loc], fp8_bits(quantize_kv_ref(v, cache_dtype, 2.5)))
        torch.testing.assert_close(dequantize_kv_ref(gather_kv(k_cache, loc), 0.3), k.float(),
                                   rtol=0.07, atol=0.3 * 2**-9)  # e4m3: 3 mantissa bits
        k_cache, v_cache, kc_before, vc_before = map(fp8_bits, (k_cache, v_cache, kc_before,
                                                                vc_before))
    else:
        close(k_cache, want_kc, torch.bfloat16, scale=4)
        close(v_cache, want_vc, torch.bfloat16)
    if not fp8 and (dev == "cuda" or dtype == torch.bfloat16):  # the interpreter truncates casts
        assert torch.equal(k_cache[loc], k.bfloat16()) and torch.equal(v_cache[loc], v.bfloat16())
    assert torch.equal(k_cache[untouched], kc_before[untouched])
    assert torch.equal(v_cache[untouched], vc_before[untouched])
    with pytest.raises(AssertionError, match="all or none"):
        qk_norm_rope_(q, k, pos, cache, qw, kw, 1e-6, v=v, k_cache=k_cache)


def check_skinny_gemm(dev: str, dtype: torch.dtype, rows: list[int], n: int, k: int) -> None:
    """Every row count up to 16, odd sizes (masked tails), a strided x, with and without bias."""
    from radixserve_kernels import skinny_gemm, skinny_gemm_ref

    gen = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype).to(dev)
    b = torch.randn(n, generator=gen).to(dtype).to(dev)
    for m in rows:
        x = torch.randn(m, 2 * k, generator=gen).to(dtype).to(dev)[:, ::2] if m % 2 else \
            torch.randn(m, k, generator=gen).to(dtype).to(dev)
        for bias in (None, b):
            got = skinny_gemm(x, w, bias)
            assert got.shape == (m, n)
            want = skinny_gemm_ref(x.float(), w.float(), None if bias is None else bias.float())
            close(got, want, dtype, scale=4)


def check_silu_mul_gemv(dev: str, dtype: torch.dtype, n: int, k: int) -> None:
    """The fused down projection gives the bits of `silu_and_mul` then `skinny_gemm` (the two
    launches it replaces), with and without bias, and is close to the float32 reference."""
    from radixserve_kernels import silu_and_mul, silu_mul_gemv, silu_mul_gemv_ref, skinny_gemm

    gen = torch.Generator().manual_seed(n + 3 * k)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype).to(dev)
    b = torch.randn(n, generator=gen).to(dtype).to(dev)
    x = (torch.randn(1, 2 * k, generator=gen) * 3).to(dtype).to(dev)
    for bias in (None, b):
        got = silu_mul_gemv(x, w, bias)
        assert got.shape == (1, n)
        assert torch.equal(got, skinny_gemm(silu_and_mul(x), w, bias))
        want = silu_mul_gemv_ref(x.float(), w.float(), None if bias is None else bias.float())
        close(got, want, dtype, scale=8)
    with pytest.raises(ValueError, match=r"takes x \[1, "):
        silu_mul_gemv(x[:, :k], w, None)


def fp8_weight_case(n: int, k: int, block: tuple[int, int] | None, gen: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 weight [n, k] spread over FP8's range, its first row starting with every finite
    e4m3 value (as far as k reaches), its positive scales [n] or [ceil(n/bn), ceil(k/bk)], the
    float64 weight they stand for, expanded here independently of the kernels)."""
    w = (torch.randn(n, k, generator=gen) * 32).clamp(-448, 448).to(torch.float8_e4m3fn)
    every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    every = every[~every.float().isnan()]  # all 254 finite values, subnormals and -0 included
    shown = min(k, every.numel())
    w[0, :shown] = every[:shown]
    shape = (n,) if block is None else (-(-n // block[0]), -(-k // block[1]))
    scale = (torch.rand(shape, generator=gen) + 0.5) / (32 * k**0.5)
    if block is None:
        full = scale.double()[:, None]
    else:
        full = scale.double().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k]
    return w, scale, w.double() * full


def check_fp8_gemm(dev: str, dtype: torch.dtype, rows: list[int], n: int, k: int,
                   block: tuple[int, int] | None) -> None:
    """`fp8_gemm` and its reference against x @ (W_fp8 * scale).T in float64: row or block
    scales, ragged N and K, a strided x, with and without bias; a wrong scale in the last
    (ragged) block is seen."""
    from radixserve_kernels import fp8_gemm, fp8_gemm_ref

    gen = torch.Generator().manual_seed(n + k)
    w, scale, w_real = fp8_weight_case(n, k, block, gen)
    b = torch.randn(n, generator=gen).to(dtype)
    w, scale = w.to(dev), scale.to(dev)
    for m in rows:
        x = torch.randn(m, 2 * k, generator=gen).to(dtype)[:, ::2] if m % 2 else \
            torch.randn(m, k, generator=gen).to(dtype)
        for bias in (None, b):
            want = x.double() @ w_real.T + (0 if bias is None else bias.double())
            bias_dev = None if bias is None else bias.to(dev)
            for fn in (fp8_gemm, fp8_gemm_ref):
                got = fn(x.to(dev), w, scale, bias_dev, block)
                assert got.shape == (m, n) and got.dtype == dtype
                close(got.cpu(), want, dtype, scale=4)
    # e4m3 subnormals (row 0, columns 1-7: 2^-9 to 7 * 2^-9) count, not flushed to zero
    sub = torch.zeros(1, k, dtype=dtype)
    sub[0, 1:8] = 1.0
    want = (sub.double() @ w_real.T)[0, 0]
    assert want != 0
    for fn in (fp8_gemm, fp8_gemm_ref):
        got = fn(sub.to(dev), w, scale, None, block)[0, 0].double().cpu()
        assert abs(got - want) <= 0.01 * abs(want), (fn.__name__, got, want)
    wrong = scale.clone()
    wrong.view(-1)[-1] *= 4.0  # the last row (row scales) or the last, ragged block
    got = fp8_gemm(x.to(dev), w, wrong, None, block).cpu().double()
    assert (got - x.double() @ w_real.T)[:, -1].abs().max() > 0.05


def check_quantize_groups_fp8(dev: str, dtype: torch.dtype, rows: int, k: int, pad: int) -> None:
    """`quantize_groups_fp8` equals its reference bit for bit (values and scales) on a strided x
    with one all-zero group, pads `pad` zero rows, and the dequantized groups are within
    e4m3's half-step of x (relative, or the subnormals' absolute one)."""
    from radixserve_kernels import quantize_groups_fp8, quantize_groups_fp8_ref

    gen = torch.Generator().manual_seed(rows + k)
    x = (torch.randn(rows, 2 * k, generator=gen) * torch.rand(rows, 1, generator=gen) * 50)
    x = x.to(dtype)[:, :k]
    x[0, :128] = 0
    want_q, want_s = quantize_groups_fp8_ref(x)
    q, s = quantize_groups_fp8(x.to(dev), rows + pad)
    assert q.shape == (rows + pad, k) and s.shape == (rows + pad, k // 128)
    assert s.stride() == (1, rows + pad)  # column-major, as cuBLASLt reads it
    assert torch.equal(q[:rows].cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(s[:rows].cpu(), want_s)
    assert not q[rows:].float().any()
    step = s[:rows].cpu().repeat_interleave(128, 1)
    back = q[:rows].cpu().float() * step
    # e4m3 keeps 3 mantissa bits (half-step 1/16 relative); subnormals' half-step is 2^-10
    assert ((back - x.float()).abs() <= x.float().abs() / 16 + step * 2**-10).all()


def check_blockwise_fp8_gemm(dtype: torch.dtype, rows: list[int], n: int, k: int) -> None:
    """`blockwise_fp8_gemm` (cuBLASLt) against its reference (x rounded per 128 columns, float32
    product: within 1% as a whole) and, within 5%, the exact product of x and the dequantized
    weight; ragged row counts (padded inside), strided x, bias; a wrong block scale is seen."""
    from radixserve_kernels import blockwise_fits, blockwise_fp8_gemm, blockwise_fp8_gemm_ref

    gen = torch.Generator().manual_seed(n + k)
    w, scale, w_real = fp8_weight_case(n, k, (128, 128), gen)
    w, scale = w.cuda(), scale.cuda()
    b = torch.randn(n, generator=gen).to(dtype)
    for m in rows:
        x = torch.randn(m, 2 * k, generator=gen).to(dtype)[:, ::2] if m % 2 else \
            torch.randn(m, k, generator=gen).to(dtype)
        assert blockwise_fits(x.cuda(), w, scale, (128, 128))
        for bias in (None, b):
            got = blockwise_fp8_gemm(x.cuda(), w, scale, None if bias is None else bias.cuda())
            assert got.shape == (m, n) and got.dtype == dtype
            # cuBLASLt writes bf16 and sums in its own order: held to the reference as a whole
            want = blockwise_fp8_gemm_ref(x, w.cpu(), scale.cpu(), bias).double()
            rel = (got.cpu().double() - want).norm() / want.norm()
            assert rel < 1e-2, (m, float(rel))
            exact = x.double() @ w_real.T + (0 if bias is None else bias.double())
            rel = (got.cpu().double() - exact).norm() / exact.norm()
            assert rel < 0.05, (m, float(rel))
    wrong = scale.clone()
    wrong[-1, -1] *= 4.0
    got = blockwise_fp8_gemm(x.cuda(), w, wrong).cpu().double()
    assert (got - x.double() @ w_real.T)[:, -128:].abs().max() > 0.05


def check_store_kv(dev: str, dtype: torch.dtype, tokens: int, heads: int, dim: int) -> None:
    from radixserve_kernels import store_kv, store_kv_ref

    gen = torch.Generator().manual_seed(tokens)
    kc = torch.randn(4 * tokens + 8, heads, dim, generator=gen).to(dtype).to(dev)
    vc = torch.randn(kc.shape, generator=gen).to(dtype).to(dev)
    kv = torch.randn(tokens, 2 * heads, dim, generator=gen).to(dtype).to(dev)
    k, v = kv[:, :heads], kv[:, heads:]
    loc = torch.randperm(kc.shape[0], generator=gen)[:tokens].to(dev)
    want_k, want_v = kc.clone(), vc.clone()
    store_kv_ref(want_k, want_v, k, v, loc)
    store_kv(kc, vc, k, v, loc)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


# An FP8 cache's per-tensor scales in the attention checks: far from 1.0 and unlike each other,
# so a kernel that drops or swaps one is caught.
FP8_SCALES = {"k_scale": 0.3, "v_scale": 2.5}


def fp8_bits(x: torch.Tensor) -> torch.Tensor:
    """An FP8 tensor's bytes, to compare exactly (torch.equal has no FP8 kernels)."""
    return x.view(torch.uint8)


def check_store_kv_fp8(dev: str, dtype: torch.dtype, tokens: int, heads: int, dim: int) -> None:
    """Into FP8 caches: bit for bit what `store_kv_ref` writes, at scale 1.0 and at scales that
    push values past ±448 (clamped, never NaN); other rows untouched."""
    from radixserve_kernels import store_kv, store_kv_ref

    gen = torch.Generator().manual_seed(tokens + 8)
    fp8 = torch.float8_e4m3fn
    kc = torch.randn(4 * tokens + 8, heads, dim, generator=gen).to(fp8).to(dev)
    vc = torch.randn(kc.shape, generator=gen).to(fp8).to(dev)
    kv = (30 * torch.randn(tokens, 2 * heads, dim, generator=gen)).to(dtype).to(dev)
    k, v = kv[:, :heads], kv[:, heads:]
    loc = torch.randperm(kc.shape[0], generator=gen)[:tokens].to(dev)
    untouched = torch.ones(kc.shape[0], dtype=torch.bool, device=dev)
    untouched[loc] = False
    for k_scale, v_scale in ((1.0, 1.0), (0.02, 3.7)):
        want_k, want_v = kc.clone(), vc.clone()
        store_kv_ref(want_k, want_v, k, v, loc, k_scale, v_scale)
        got_k, got_v = kc.clone(), vc.clone()
        store_kv(got_k, got_v, k, v, loc, k_scale, v_scale)
        assert torch.equal(fp8_bits(got_k), fp8_bits(want_k))
        assert torch.equal(fp8_bits(got_v), fp8_bits(want_v))
        assert torch.equal(fp8_bits(got_k)[untouched], fp8_bits(kc)[untouched])
        assert not got_k.float().isnan().any() and not got_v.float().isnan().any()
    assert (want_k.float()[loc].abs() == 448).any()  # the last scales did saturate


def check_decode(dev: str, dtype: torch.dtype, seq_lens: list[int], heads: tuple[int, int],
                 dim: int, page: int, splits: list[int | None],
                 kv_dtype: torch.dtype | None = None, shape: DecodeShape | None = None) -> None:
    """`kv_dtype` float8_e4m3fn: the caches hold FP8 with `FP8_SCALES`. `shape`: a
    `DecodeShape` in place of the launcher's choice for the batch size. Launched longest request
    first (`decode_order`'s order, at any batch size), each request's output is the same, bit
    for bit."""
    from radixserve_kernels import decode_attention, decode_attention_ref

    gen = torch.Generator().manual_seed(sum(seq_lens) + page)
    hq, hk = heads
    num_pages = sum(-(-n // page) for n in seq_lens) + 3
    table, rows = paged_table(seq_lens, page, num_pages, max(seq_lens) + page, gen)
    kc, vc = kv_pool(num_pages, page, hk, dim, kv_dtype or dtype, gen)
    scales = FP8_SCALES if kv_dtype == torch.float8_e4m3fn else {}
    q = torch.randn(len(seq_lens), hq, dim, generator=gen).to(dtype)
    args = [t.to(dev) for t in (q, kc, vc, table, rows, torch.tensor(seq_lens, dtype=torch.int32))]
    want = decode_attention_ref(*args, dim**-0.5, **scales)
    for i, s in enumerate(splits):
        got = decode_attention(*args, dim**-0.5, num_splits=s, shape=shape, **scales)
        close(got, want, dtype, scale=scales.get("v_scale", 1.0))
        if i == 0:
            order = torch.argsort(args[-1], descending=True, stable=True)
            assert torch.equal(decode_attention(*args, dim**-0.5, num_splits=s, shape=shape,
                                                order=order, **scales), got)


def mostly_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale: float,
                 rare: float = 1e-3) -> None:
    """`close`, except that under a fraction `rare` of the elements may be off by up to 4x the
    tolerance: a q or a new key rounded one unit apart in 16 bits (or one e4m3 step) moves
    the output most where a head's softmax is sharp."""
    rtol, atol = TOL[dtype]
    err = (got.float() - want.float()).abs()
    bound = atol * scale + rtol * want.float().abs()
    assert (err > bound).float().mean().item() < rare, f"{int((err > bound).sum())} elements off"
    assert (err <= 4 * bound).all(), f"max error {err.max().item()}"


def check_decode_rope(dev: str, dtype: torch.dtype, seq_lens: list[int], heads: tuple[int, int],
                      dim: int, splits: list[int | None], kv_dtype: torch.dtype | None = None,
                      shape: DecodeShape | None = None) -> None:
    """`decode_attention` given the new token raw (`NewTokenKV`: strided views of a fused qkv,
    with and without Qwen3's q/k norms): its output is the reference's, and so are the caches,
    where only the new tokens' slots change; q is left as it came. And it is what the rotary
    kernel followed by the plain decode kernel gives, the two launches it replaces (within the
    same 16-bit tolerance: the kernel folds the new key in last, not inside its block)."""
    from radixserve_kernels import (
        NewTokenKV,
        RopeParams,
        build_cos_sin_cache,
        decode_attention,
        decode_attention_ref,
        qk_norm_rope_,
    )

    gen = torch.Generator().manual_seed(sum(seq_lens) + dim)
    hq, hk = heads
    page = 4
    num_pages = sum(-(-n // page) for n in seq_lens) + 3
    table, rows = paged_table(seq_lens, page, num_pages, max(seq_lens) + page, gen)
    kcache, vcache = kv_pool(num_pages, page, hk, dim, kv_dtype or dtype, gen)
    scales = FP8_SCALES if kv_dtype == torch.float8_e4m3fn else {}
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    loc = torch.stack([table[r, n - 1] for r, n in zip(rows.tolist(), seq_lens)]).long()
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    cache = build_cos_sin_cache(inv_freq, max(seq_lens) + 1).to(dev)
    qw = (1 + 0.3 * torch.randn(dim, generator=gen)).to(dtype).to(dev)
    kw = (1 + 0.3 * torch.randn(dim, generator=gen)).to(dtype).to(dev)
    others = torch.ones(kcache.shape[0], dtype=torch.bool)
    others[loc] = False
    k_scale, v_scale = scales.get("k_scale", 1.0), scales.get("v_scale", 1.0)
    # a new key one e4m3 step off moves its scores as a 16-bit rounding would
    out_tol = torch.float16 if scales and dtype == torch.float32 else dtype
    for weights in ((qw, kw), (None, None)):
        b = len(seq_lens)
        qkv = (3 * torch.randn(b, (hq + 2 * hk) * dim, generator=gen)).to(dtype).to(dev)
        q = qkv[:, : hq * dim].view(b, hq, dim)
        k = qkv[:, hq * dim : (hq + hk) * dim].view(b, hk, dim)
        v = qkv[:, (hq + hk) * dim :].view(b, hk, dim)
        before = qkv.clone()
        new = NewTokenKV(k, v, loc.to(dev), RopeParams(cache, *weights, 1e-6))
        args = [t.to(dev) for t in (table, rows, lens)]
        want_kv = [c.clone().to(dev) for c in (kcache, vcache)]
        want = decode_attention_ref(q, *want_kv, *args, dim**-0.5, new_kv=new, **scales)
        for s in splits:
            got_kv = [c.clone().to(dev) for c in (kcache, vcache)]
            got = decode_attention(q, *got_kv, *args, dim**-0.5, num_splits=s, shape=shape,
                                   new_kv=new, **scales)
            mostly_close(got, want, out_tol, scale=8 * scales.get("v_scale", 1.0))
            for g, w, c, sc in zip(got_kv, want_kv, (kcache, vcache), (k_scale, v_scale)):
                if kv_dtype == torch.float8_e4m3fn:  # in k's units: an e4m3 step, and the rotation's
                    torch.testing.assert_close(g[loc].float() * sc, w[loc].float() * sc, rtol=0.125,
                                               atol=4 * TOL[dtype][1] + 2**-9 * sc)
                else:
                    close(g[loc], w[loc], dtype, scale=4)
                assert torch.equal(g.cpu()[others].view(torch.uint8), c[others].view(torch.uint8))
            assert torch.equal(qkv, before)
            # the two launches it replaces: the rotary kernel storing k/v, then plain decode
            two_kv = [c.clone().to(dev) for c in (kcache, vcache)]
            q2, k2 = q.clone(), k.clone()
            qk_norm_rope_(q2, k2, lens.to(dev).long() - 1, cache, *weights, 1e-6, v=v,
                          k_cache=two_kv[0], v_cache=two_kv[1], out_loc=loc.to(dev), **scales)
            for g, t, sc in zip(got_kv, two_kv, (k_scale, v_scale)):
                torch.testing.assert_close(g[loc].float() * sc, t[loc].float() * sc, rtol=0.125,
                                           atol=4 * TOL[dtype][1] + 2**-9 * sc)
            # the plain decode over the fused kernel's own stores: the two norms reduce in
            # different orders, so an FP8 key may land one e4m3 step apart, which moves a head
            # whose softmax the new token dominates by more than any 16-bit tolerance (H200)
            two = decode_attention(q2, *got_kv, *args, dim**-0.5, num_splits=s, shape=shape,
                                   **scales)
            mostly_close(got, two, out_tol, scale=8 * scales.get("v_scale", 1.0))


def check_extend(dev: str, dtype: torch.dtype, prefix_lens: list[int], extend_lens: list[int],
                 heads: tuple[int, int], dim: int, page: int,
                 kv_dtype: torch.dtype | None = None) -> None:
    """`kv_dtype` float8_e4m3fn: the caches hold FP8 with `FP8_SCALES`."""
    from radixserve_kernels import extend_attention, extend_attention_ref

    gen = torch.Generator().manual_seed(sum(extend_lens) + page)
    hq, hk = heads
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_pages = sum(-(-n // page) for n in seq_lens) + 3
    table, rows = paged_table(seq_lens, page, num_pages, max(seq_lens) + page, gen)
    kc, vc = kv_pool(num_pages, page, hk, dim, kv_dtype or dtype, gen)
    scales = FP8_SCALES if kv_dtype == torch.float8_e4m3fn else {}
    q = torch.randn(sum(extend_lens), hq, dim, generator=gen).to(dtype)
    ext = torch.tensor(extend_lens, dtype=torch.int32)
    args = [t.to(dev) for t in (q, kc, vc, table, rows, torch.tensor(seq_lens, dtype=torch.int32), ext)]
    want = extend_attention_ref(*args, dim**-0.5, **scales)
    qo_start = (torch.cumsum(ext, 0) - ext).to(torch.int32).to(dev)
    got = extend_attention(*args, dim**-0.5, qo_start, max(extend_lens), **scales)
    close(got, want, dtype, scale=scales.get("v_scale", 1.0))


def check_moe(dev: str, dtype: torch.dtype, tokens: int, hidden: int, inter: int, experts: int,
              top_k: int) -> None:
    from radixserve_kernels import fused_moe, fused_moe_ref, topk_softmax, topk_softmax_ref

    gen = torch.Generator().manual_seed(tokens + experts)
    logits = torch.randn(tokens, experts, generator=gen).to(dtype).to(dev)
    for norm in (True, False):
        w, ids = topk_softmax(logits, top_k, norm)
        want_w, want_ids = topk_softmax_ref(logits, top_k, norm)
        # 16-bit logits tie often and torch.topk breaks ties its own way: compare the chosen
        # probabilities, and that each token's experts are distinct
        probs = torch.softmax(logits.float(), dim=-1)
        assert torch.equal(probs.gather(1, ids.long()), probs.gather(1, want_ids.long()))
        assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()
        torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(dev)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5).to(dtype).to(dev)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5).to(dtype).to(dev)
    got = fused_moe(x, w13, w2, want_w, want_ids)
    want = fused_moe_ref(x, w13, w2, want_w, want_ids)
    rtol, _ = TOL[dtype]
    err = (got.float() - want.float()).abs().max().item()
    assert err <= 4 * rtol * want.float().abs().max().item() + 1e-5, err


def check_lora(dev: str, dtype: torch.dtype, tokens: int, hidden: int, parts: tuple[int, ...],
               rank: int, slots: int) -> None:
    """Shrink then expand against the references over a batch mixing every slot, base-model
    tokens (slot -1: their rows of y unchanged, bit for bit) and a slot with no token."""
    from radixserve_kernels import (
        lora_expand_,
        lora_expand_ref,
        lora_groups,
        lora_shrink,
        lora_shrink_ref,
    )

    gen = torch.Generator().manual_seed(tokens + hidden)
    out, p = parts[-1], len(parts) - 1
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(dev)
    a = (torch.randn(slots, p * rank, hidden, generator=gen) * hidden**-0.5).to(dtype).to(dev)
    b = (torch.randn(slots, out, rank, generator=gen) * rank**-0.5).to(dtype).to(dev)
    token_slots = torch.randint(-1, slots - 1, (tokens,), generator=gen)  # slot S-1 unused
    groups = lora_groups(token_slots.to(dev), slots)
    assert groups.counts.tolist() == [int((token_slots == s).sum()) for s in range(slots)]
    mine = (token_slots >= 0).to(dev)
    v, want_v = lora_shrink(x, a, groups).sum(0).to(dtype), lora_shrink_ref(x, a, groups)
    close(v[mine], want_v[mine], dtype, scale=4)
    y0 = torch.randn(tokens, out, generator=gen).to(dtype).to(dev)
    # y as a strided view (a column slice of a wider buffer, as a fused projection's output)
    y = torch.cat([y0, y0[:, :3]], dim=1)[:, :out]
    want = lora_expand_ref(y0.clone(), want_v, b, groups, parts)
    lora_expand_(y, want_v, b, groups, parts)
    close(y, want, dtype, scale=4)
    assert torch.equal(y[~mine], y0[~mine])
    # the layer's path: the shrink's partial planes left for the expand to sum as it reads them
    y = torch.cat([y0, y0[:, :3]], dim=1)[:, :out]
    lora_expand_(y, lora_shrink(x, a, groups), b, groups, parts)
    close(y, want, dtype, scale=4)
    assert torch.equal(y[~mine], y0[~mine])


def check_lora_gemv(dev: str, dtype: torch.dtype, hidden: int, parts: tuple[int, ...], rank: int,
                    slots: int, gated: bool) -> None:
    """The one-row product with its adapter's update in the GEMV's epilogue: close to the float32
    reference for every slot and the base model (slot -1: the plain GEMV's bits), with and
    without bias; `gated`: the down projection's [gate | up] input, its activation computed by
    both kernels."""
    from radixserve_kernels import lora_gemv, lora_gemv_ref, lora_groups, silu_and_mul, skinny_gemm

    gen = torch.Generator().manual_seed(hidden + rank + gated)
    out, p = parts[-1], len(parts) - 1
    x = (torch.randn(1, 2 * hidden if gated else hidden, generator=gen) * 2).to(dtype).to(dev)
    w = (torch.randn(out, hidden, generator=gen) * hidden**-0.5).to(dtype).to(dev)
    bias = torch.randn(out, generator=gen).to(dtype).to(dev)
    a = (torch.randn(slots, p * rank, hidden, generator=gen) * hidden**-0.5).to(dtype).to(dev)
    b = (torch.randn(slots, out, rank, generator=gen) * rank**-0.5).to(dtype).to(dev)
    b[0, : parts[1]] = 0  # slot 0's adapter leaves projection 0 out
    x_in = silu_and_mul(x) if gated else x
    for slot in range(-1, slots):
        groups = lora_groups(torch.tensor([slot], dtype=torch.int32, device=dev), slots)
        for bb in (None, bias):
            got = lora_gemv(x, w, bb, a, b, groups, parts, gated)
            assert got.shape == (1, out)
            if slot < 0:
                assert torch.equal(got, skinny_gemm(x_in, w, bb))
                continue
            want = lora_gemv_ref(x.float(), w.float(), None if bb is None else bb.float(),
                                 a.float(), b.float(),
                                 groups, parts, gated)
            close(got, want, dtype, scale=8)
            delta = (got.float() - skinny_gemm(x_in, w, bb).float()).abs()
            if slot == 0:  # the projection left out: the base product's bits there
                assert (delta[:, : parts[1]] == 0).all()
            assert (slot == 0 and p == 1) or delta[:, 0 if slot else parts[1]:].max() > 0
    buf = torch.full((1, out), 7.0, dtype=dtype, device=dev)
    assert lora_gemv(x, w, None, a, b, groups, parts, gated, out=buf) is buf
    close(buf, lora_gemv_ref(x.float(), w.float(), None, a.float(), b.float(), groups, parts,
                             gated), dtype, scale=8)
    with pytest.raises(ValueError, match="takes one row"):
        lora_gemv(torch.cat([x, x]), w, None, a, b, groups, parts, gated)


def check_page_indices(dev: str, seq_lens: list[int], page: int) -> None:
    from radixserve_kernels import page_indices, page_indices_ref

    gen = torch.Generator().manual_seed(page)
    num_pages = sum(-(-n // page) for n in seq_lens) + 1
    table, rows = paged_table(seq_lens, page, num_pages, max(seq_lens) + page, gen)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    n_pages = (seq + page - 1) // page
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n_pages, 0)]).to(torch.int32)
    out = torch.full((int(indptr[-1]) + 5,), -7, dtype=torch.int32, device=dev)
    page_indices(table.to(dev), rows.to(dev), seq.to(dev), page, indptr.to(dev), out)
    want = page_indices_ref(table, rows, seq, page)
    assert torch.equal(out[: len(want)].cpu(), want)
    assert (out[len(want):] == -7).all()


# ---- whole batches for the attention backends ------------------------------------------------
def backend_case(dev: str, dtype: torch.dtype, page: int, prefix_lens: list[int],
                 extend_lens: list[int], heads: tuple[int, int], dim: int, seed: int = 0,
                 num_layers: int = 2, kv_dtype: torch.dtype | None = None):
    """(AttnConfig, Batch, q, k, v): a pool whose prefix slots hold random K/V, a shuffled page
    table, and the new tokens' q/k/v. `extend_lens` all 1 gives a decode batch. `kv_dtype`
    float8_e4m3fn: an FP8 pool with `FP8_SCALES` in every layer."""
    from radixserve.attention.base import AttnConfig
    from radixserve.core.batch import Batch
    from radixserve.kvcache.pool import MHAKVPool

    gen = torch.Generator().manual_seed(seed)
    hq, hk = heads
    seq = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_pages = sum(-(-n // page) for n in seq) + 2
    max_len = -(-max(seq) // page) * page + page
    table, rows = paged_table(seq, page, num_pages, max_len, gen)
    kv_dtype = kv_dtype or dtype
    scales = {}
    if kv_dtype == torch.float8_e4m3fn:
        scales = {"k_scales": [FP8_SCALES["k_scale"]] * num_layers,
                  "v_scales": [FP8_SCALES["v_scale"]] * num_layers}
    pool = MHAKVPool(num_layers, num_pages, page, hk, dim, kv_dtype, dev, **scales)
    for layer in range(num_layers):
        for c in (pool.k_cache(layer), pool.v_cache(layer)):
            c.copy_(torch.randn(c.shape, generator=gen).to(kv_dtype))
    out_loc = torch.cat([table[r, p:n] for r, p, n in zip(rows.tolist(), prefix_lens, seq)])
    positions = torch.cat([torch.arange(p, n) for p, n in zip(prefix_lens, seq)])
    t = int(sum(extend_lens))
    cfg = AttnConfig(num_qo_heads=hq, num_kv_heads=hk, head_dim=dim, page_size=page, kv_pool=pool,
                     page_table=table.to(dev), device=torch.device(dev), dtype=dtype)
    batch = Batch(
        phase="decode" if all(e == 1 for e in extend_lens) else "prefill",
        input_ids=torch.zeros(t, dtype=torch.int64, device=dev), positions=positions.to(dev),
        out_loc=out_loc.long().to(dev), req_rows=rows.to(dev),
        seq_lens=torch.tensor(seq, dtype=torch.int32, device=dev),
        extend_lens=torch.tensor(extend_lens, dtype=torch.int32, device=dev),
        seq_lens_cpu=seq, extend_lens_cpu=list(extend_lens),
    )
    q, k, v = (torch.randn(t, h, dim, generator=gen).to(dtype).to(dev) for h in (hq, hk, hk))
    return cfg, batch, q, k, v


# Batches for sliding-window layers (window 24 in the tests): (cached prefix lengths, new tokens)
WINDOW_CASES = {
    "prefix-hits-and-decode": ([700, 0, 40, 33, 5, 2], [40, 300, 1, 2, 1, 1]),
    "long-prompt": ([0, 130], [1100, 1]),
    "decode-only": ([0, 4, 1500, 33], [1, 1, 1, 1]),
}


def windowed_reference(cfg, batch, q: torch.Tensor, layer: int,
                       window: int | None) -> torch.Tensor:
    """float64 attention of each request's queries over its page-table row's keys, query i at
    position prefix + i seeing keys j with prefix + i - window < j <= prefix + i."""
    from radixserve_kernels.kv_quant import dequantize_kv_ref, gather_kv

    pool, table = cfg.kv_pool, cfg.page_table
    rep = q.shape[1] // cfg.num_kv_heads
    outs, start = [], 0
    for row, n, e in zip(batch.req_rows.tolist(), batch.seq_lens_cpu, batch.extend_lens_cpu):
        slots = table[row, :n].long()
        k = dequantize_kv_ref(gather_kv(pool.k_cache(layer), slots), pool.k_scale(layer)).double()
        v = dequantize_kv_ref(gather_kv(pool.v_cache(layer), slots), pool.v_scale(layer)).double()
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = torch.einsum("qhd,khd->hqk", q[start:start + e].double(), k) * cfg.scale
        pos = (n - e + torch.arange(e, device=q.device))[:, None]
        key = torch.arange(n, device=q.device)[None, :]
        allowed = (key <= pos) & (key > pos - (window if window is not None else n + 1))
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
        start += e
    return torch.cat(outs)


def run_backend(backend, batch, q, k, v, layers: int = 2, kv_stored: bool = False) -> list[torch.Tensor]:
    """Each layer's output. `kv_stored`: k/v go into the pool first, as the fused rotary kernel
    stores them, and the backend gets None for them."""
    backend.prepare(batch)
    outs = []
    for layer in range(layers):
        if kv_stored:
            backend.cfg.kv_pool.store_kv(k, v, batch.out_loc, layer)
        new_kv = (None, None) if kv_stored else (k, v)
        outs.append(backend.forward(q, *new_kv, layer, batch))
    return outs


# ---- sliding windows: the kernels against their references and dense windowed attention -------
# (cached prefix lengths, new tokens): a prefix far longer than the window, a prompt of several
# query blocks without one, a short extend whose window starts inside its prefix
WINDOWED_EXTEND = ([700, 0, 37], [90, 130, 5])
WINDOWED_DECODE = [0, 23, 24, 69, 299]  # cached keys before each request's new token


def layer0_args(cfg, batch, q: torch.Tensor) -> tuple:
    pool = cfg.kv_pool
    return (q, pool.k_cache(0), pool.v_cache(0), cfg.page_table, batch.req_rows, batch.seq_lens)


def _layer0_scales(cfg) -> dict[str, float]:
    return {"k_scale": cfg.kv_pool.k_scale(0), "v_scale": cfg.kv_pool.v_scale(0)}


def _poison_keys_before(cfg, batch, first: list[int]) -> None:
    """NaN into layer 0's K and V of each request's keys before `first[i]`."""
    pool = cfg.kv_pool
    for row, n in zip(batch.req_rows.tolist(), first):
        slots = cfg.page_table[row, :n].long()
        pool.k_cache(0)[slots] = float("nan")
        pool.v_cache(0)[slots] = float("nan")


def _check_windowed_reference(cfg, batch, q: torch.Tensor, window: int,
                              ref: torch.Tensor) -> None:
    """The reference is dense windowed attention, and the window did cut keys."""
    torch.testing.assert_close(ref.double(), windowed_reference(cfg, batch, q, 0, window),
                               rtol=1e-5, atol=1e-5)
    assert (ref.double() - windowed_reference(cfg, batch, q, 0, None)).abs().max() > 1e-2


def _windowed_extend(cfg, batch, q: torch.Tensor, window: int, ref: bool = False) -> torch.Tensor:
    from radixserve_kernels import extend_attention, extend_attention_ref

    args = (*layer0_args(cfg, batch, q), batch.extend_lens, cfg.scale)
    if ref:
        return extend_attention_ref(*args, window=window, **_layer0_scales(cfg))
    ext = batch.extend_lens
    qo_start = torch.cumsum(ext, 0, dtype=torch.int32) - ext
    return extend_attention(*args, qo_start, max(batch.extend_lens_cpu), window=window,
                            **_layer0_scales(cfg))


def check_windowed_extend(dev: str, page: int, window: int, heads: tuple[int, int], dim: int,
                          kv_dtype: torch.dtype | None = None) -> None:
    """float32 q over `WINDOWED_EXTEND`; the key loop starts at the block holding the first query
    block's first key (blocks of 32 or 64 keys, so no key below a multiple of 128 under it is
    read: NaN there changes nothing)."""
    cfg, batch, q, *_ = backend_case(dev, torch.float32, page, *WINDOWED_EXTEND, heads, dim,
                                     seed=page + window, kv_dtype=kv_dtype)
    ref = _windowed_extend(cfg, batch, q, window, ref=True)
    _check_windowed_reference(cfg, batch, q, window, ref)
    got = _windowed_extend(cfg, batch, q, window)
    close(got, ref, torch.float32, scale=_layer0_scales(cfg)["v_scale"])
    first = [max(s - e - window + 1, 0) // 128 * 128
             for s, e in zip(batch.seq_lens_cpu, batch.extend_lens_cpu)]
    assert first[0] >= 512
    _poison_keys_before(cfg, batch, first)
    assert torch.equal(_windowed_extend(cfg, batch, q, window), got)


def check_windowed_decode(dev: str, page: int, window: int, heads: tuple[int, int], dim: int,
                          splits: list[int], shape: DecodeShape | None = None,
                          kv_dtype: torch.dtype | None = None) -> None:
    """float32 q over `WINDOWED_DECODE`: the splits divide the window's keys in whole key blocks,
    so with several some get none (lse -inf, weight 0 in the merge); each split starts inside
    the window, so no key before it is read (NaN there changes nothing)."""
    from radixserve_kernels import decode_attention, decode_attention_ref

    lens = WINDOWED_DECODE
    cfg, batch, q, *_ = backend_case(dev, torch.float32, page, lens, [1] * len(lens), heads, dim,
                                     seed=page + window, kv_dtype=kv_dtype)
    scales = _layer0_scales(cfg)
    ref = decode_attention_ref(*layer0_args(cfg, batch, q), cfg.scale, window=window, **scales)
    _check_windowed_reference(cfg, batch, q, window, ref)
    for s in splits:
        got = decode_attention(*layer0_args(cfg, batch, q), cfg.scale, num_splits=s,
                               shape=shape, window=window, **scales)
        close(got, ref, torch.float32, scale=scales["v_scale"])
    _poison_keys_before(cfg, batch, [max(n - window, 0) for n in batch.seq_lens_cpu])
    assert torch.equal(decode_attention(*layer0_args(cfg, batch, q), cfg.scale, num_splits=s,
                                        shape=shape, window=window, **scales), got)


def check_windowed_decode_rope(dev: str, window: int, heads: tuple[int, int], dim: int,
                               shape: DecodeShape | None = None) -> None:
    """`NewTokenKV`: the kernel rotates q and the new key and stores k/v itself; the new token is
    the window's last key, in the last of 3 splits that has keys."""
    from radixserve_kernels import (
        NewTokenKV,
        RopeParams,
        build_cos_sin_cache,
        decode_attention,
        decode_attention_ref,
    )
    from radixserve_kernels.decode_attention import rotate_new_token_ref

    lens = WINDOWED_DECODE
    cfg, batch, q, k, v = backend_case(dev, torch.float32, 4, lens, [1] * len(lens), heads, dim,
                                       seed=7)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    new = NewTokenKV(k, v, batch.out_loc, RopeParams(build_cos_sin_cache(inv_freq, 512).to(dev)))
    pool, rest = cfg.kv_pool, (cfg.page_table, batch.req_rows, batch.seq_lens, cfg.scale)
    got_kv = [pool.k_cache(0).clone(), pool.v_cache(0).clone()]
    got = decode_attention(q, *got_kv, *rest, num_splits=3, shape=shape, new_kv=new,
                           window=window)
    ref_kv = [pool.k_cache(0).clone(), pool.v_cache(0).clone()]
    ref = decode_attention_ref(q, *ref_kv, *rest, new_kv=new, window=window)
    # the truth: over the pool with the rotated new k/v stored
    rotated = rotate_new_token_ref(q, pool.k_cache(0), pool.v_cache(0), batch.seq_lens, new)
    _check_windowed_reference(cfg, batch, rotated, window, ref)
    close(got, ref, torch.float32, scale=4)
    for g, r in zip(got_kv, ref_kv):
        close(g[batch.out_loc], r[batch.out_loc], torch.float32, scale=4)


def captured(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """`step` run once on a side stream (Triton compiles outside the capture), then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph
