"""Micro-benchmarks of the attention kernels on CUDA: `python -m radixserve_kernels.bench
[--kv-dtype fp8]`. Prints µs per call for Triton and (if installed) FlashInfer at Qwen3-0.6B's
attention shape, over a bf16 or an FP8 (e4m3) KV cache; q is bf16 either way. Decode also runs
the offline workload's mix of lengths (100-2,048 keys) in batch order and longest first."""
from __future__ import annotations

import argparse

import torch

from radixserve_kernels import decode_attention, extend_attention, page_indices
from radixserve_kernels.decode_attention import decode_num_splits, decode_order


def _time_us(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def _layout(bs: int, ctx: int, page: int, hk: int, d: int, kv_dtype: torch.dtype):
    pages_per = -(-ctx // page)
    num_pages = bs * pages_per + 1
    perm = torch.randperm(num_pages - 1, device="cuda")[: bs * pages_per].view(bs, pages_per)
    table = (perm[:, :, None] * page + torch.arange(page, device="cuda")).flatten(1)[:, :ctx]
    table = table.to(torch.int32).contiguous()
    kc = torch.randn(num_pages * page, hk, d, device="cuda").to(kv_dtype)
    vc = torch.randn(kc.shape, device="cuda").to(kv_dtype)
    rows = torch.arange(bs, device="cuda")
    seq = torch.full((bs,), ctx, dtype=torch.int32, device="cuda")
    return table, kc, vc, rows, seq


def _flashinfer_pages(table: torch.Tensor, rows: torch.Tensor, seq: torch.Tensor, ctx: int,
                      page: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's view of `_layout`'s requests: (page indptr, page indices, last page lengths,
    workspace)."""
    bs = rows.shape[0]
    indptr = torch.arange(bs + 1, dtype=torch.int32) * -(-ctx // page)
    idx = torch.empty(int(indptr[-1]), dtype=torch.int32, device="cuda")
    page_indices(table, rows, seq, page, indptr.cuda(), idx)
    last = torch.full((bs,), (ctx - 1) % page + 1, dtype=torch.int32)
    return indptr, idx, last, torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")


def bench_decode(bs: int, ctx: int, page: int, kv_dtype: torch.dtype = torch.bfloat16,
                 hq: int = 16, hk: int = 8, d: int = 128) -> None:
    dtype = torch.bfloat16
    table, kc, vc, rows, seq = _layout(bs, ctx, page, hk, d, kv_dtype)
    q = torch.randn(bs, hq, d, device="cuda", dtype=dtype)
    bound = bs * ctx * 2 * hk * d * kc.element_size() / 4.26e12 * 1e6
    line = f"decode bs={bs:4d} ctx={ctx:5d} page={page:3d} bound={bound:7.1f}us"
    default = decode_num_splits(bs, hk, torch.cuda.get_device_properties(0).multi_processor_count)
    for s in sorted({1, 2, 4, 8, 16, default}):
        us = _time_us(lambda s=s: decode_attention(q, kc, vc, table, rows, seq, d**-0.5, num_splits=s))
        line += f" triton[s={s}{'*' if s == default else ''}]={us:7.1f}"
    graph = torch.cuda.CUDAGraph()  # GPU time alone, without Triton's host-side launch cost
    with torch.cuda.graph(graph):
        decode_attention(q, kc, vc, table, rows, seq, d**-0.5, num_splits=default)
    line += f" triton-graph={_time_us(graph.replay):7.1f}"
    try:
        import flashinfer
    except ImportError:
        print(line, flush=True)
        return
    indptr, idx, last, ws = _flashinfer_pages(table, rows, seq, ctx, page)
    paged = (kc.view(-1, page, hk, d), vc.view(-1, page, hk, d))
    for tc in (False, True):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc, backend="fa2")
        w.plan(indptr, idx, last, hq, hk, d, page, q_data_type=dtype, kv_data_type=kv_dtype)
        line += f" flashinfer[tc={int(tc)}]={_time_us(lambda w=w: w.run(q, paged)):7.1f}"
    print(line, flush=True)


def bench_decode_mix(bs: int, lo: int, hi: int, kv_dtype: torch.dtype = torch.bfloat16,
                     hq: int = 16, hk: int = 8, d: int = 128) -> None:
    """Decode over requests of mixed lengths, uniform in [lo, hi] as in the offline workload's
    large batches, launched in batch order and longest first (`decode_order`)."""
    table, kc, vc, rows, _ = _layout(bs, hi, 16, hk, d, kv_dtype)
    seq = torch.randint(lo, hi + 1, (bs,), dtype=torch.int32, device="cuda")
    q = torch.randn(bs, hq, d, device="cuda", dtype=torch.bfloat16)
    bound = int(seq.sum()) * 2 * hk * d * kc.element_size() / 4.26e12 * 1e6
    line = f"decode bs={bs:4d} ctx={lo}-{hi} page= 16 bound={bound:7.1f}us"
    for label, order in (("batch order", None), ("longest first", decode_order(seq))):
        decode_attention(q, kc, vc, table, rows, seq, d**-0.5, order=order)  # compiled outside
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decode_attention(q, kc, vc, table, rows, seq, d**-0.5, order=order)
        line += f" triton-graph[{label}]={_time_us(graph.replay):7.1f}"
    print(line, flush=True)


def bench_extend(bs: int, new: int, prefix: int, page: int,
                 kv_dtype: torch.dtype = torch.bfloat16, hq: int = 16, hk: int = 8,
                 d: int = 128) -> None:
    dtype = torch.bfloat16
    ctx = prefix + new
    table, kc, vc, rows, seq = _layout(bs, ctx, page, hk, d, kv_dtype)
    q = torch.randn(bs * new, hq, d, device="cuda", dtype=dtype)
    ext = torch.full((bs,), new, dtype=torch.int32, device="cuda")
    start = torch.arange(bs, dtype=torch.int32, device="cuda") * new
    flops = 4 * bs * hq * d * (new * prefix + new * new / 2)
    us = _time_us(lambda: extend_attention(q, kc, vc, table, rows, seq, ext, d**-0.5, start, new), 10)
    line = f"extend bs={bs} new={new} prefix={prefix} page={page} triton={us:8.1f}us ({flops / us / 1e6:5.1f} TF/s)"
    try:
        import flashinfer
    except ImportError:
        print(line, flush=True)
        return
    indptr, idx, last, ws = _flashinfer_pages(table, rows, seq, ctx, page)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(torch.arange(bs + 1, dtype=torch.int32) * new, indptr, idx, last, hq, hk, d, page,
           causal=True, q_data_type=dtype, kv_data_type=kv_dtype)
    paged = (kc.view(-1, page, hk, d), vc.view(-1, page, hk, d))
    us = _time_us(lambda: w.run(q, paged), 10)
    print(line + f" flashinfer={us:8.1f}us ({flops / us / 1e6:5.1f} TF/s)", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m radixserve_kernels.bench", description=__doc__)
    p.add_argument("--kv-dtype", choices=["bf16", "fp8"], default="bf16")
    kv_dtype = torch.float8_e4m3fn if p.parse_args(argv).kv_dtype == "fp8" else torch.bfloat16
    torch.manual_seed(0)
    print(f"KV cache {kv_dtype}, q bf16 (the bound counts the cache's bytes at 4.26 TB/s)")
    for bs, ctx in [(1, 1024), (1, 4096), (8, 1024), (64, 1024), (256, 600), (256, 1024)]:
        for page in (1, 16) if bs == 64 else (16,):
            bench_decode(bs, ctx, page, kv_dtype)
    for bs in (64, 128, 256):
        bench_decode_mix(bs, 100, 2048, kv_dtype)
    for bs, new, prefix in [(1, 2048, 0), (8, 1024, 0), (4, 512, 1536)]:
        bench_extend(bs, new, prefix, 16, kv_dtype)


if __name__ == "__main__":
    main()
