"""The skinny GEMM against cuBLAS at decode batch sizes: `python -m radixserve_kernels.bench_gemm
[--sweep]`. Qwen3-0.6B's four projections in bf16, 1/8/16 rows, µs per call timed inside a CUDA
graph (no launch cost) with the weight rotated over 12 copies, so every call reads it from HBM
rather than from L2 (one 4-12 MB weight fits in the H200's 50 MB L2). `--sweep` also tries a
grid of tile configurations, to retune `skinny_gemm_config` (and, for one row, `gemv_config`)
on another GPU."""
from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from triton.runtime import errors as triton_errors

from radixserve_kernels import gemv

SHAPES = {"qkv_proj": (4096, 1024), "o_proj": (1024, 2048), "gate_up_proj": (6144, 1024),
          "down_proj": (1024, 3072)}
COPIES = 12
SWEEP = [(bn, bk, 4, st) for bn, bk, st in itertools.product([16, 32, 64], [128, 256, 512], [2, 3, 4])]
ONE_ROW_SWEEP = list(itertools.product([2, 4, 8, 16], [128, 256, 512, 1024], [2, 4, 8], [1, 2, 3]))


def graph_us(fn: Callable[[int], object], reps: int = 24, iters: int = 10) -> float:
    """µs per `fn(r)` call, r = 0..reps-1 captured in one graph and replayed `iters` times."""
    fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(reps):
            fn(r)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (reps * iters)


def us_with_config(module: object, name: str, config: tuple | None,
                   fn: Callable[[int], object]) -> float:
    """`graph_us(fn)` with `module.name` (a tile-config function) answering `config` meanwhile;
    None keeps the chosen tiles. A tile too large for shared memory times as infinite."""
    chosen = getattr(module, name)
    if config is not None:
        setattr(module, name, lambda *shape: config)
    try:
        return graph_us(fn)
    except triton_errors.OutOfResources:  # a sweep's tile too large for shared memory
        return float("inf")
    finally:
        setattr(module, name, chosen)


def skinny_us(x: torch.Tensor, ws: list[torch.Tensor], config: tuple[int, int, int, int] | None) -> float:
    """µs per `skinny_gemm` call; `config` replaces the chosen tiles (the one-row kernel's for a
    single row), or None for the chosen ones."""
    name = "gemv_config" if x.shape[0] == 1 else "skinny_gemm_config"
    return us_with_config(gemv, name, config, lambda r: gemv.skinny_gemm(x, ws[r % COPIES], None))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="store_true", help="also try a grid of tile configurations")
    args = p.parse_args()
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 32 for _ in range(COPIES)]
        mb = n * k * 2 / 1e6
        for m in (1, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            cublas = graph_us(lambda r, x=x, ws=ws: F.linear(x, ws[r % COPIES]))
            ours = skinny_us(x, ws, None)
            line = (f"{name:13s} [{n}x{k}] {mb:4.1f} MB  rows {m:2d}  cuBLAS {cublas:6.2f} us "
                    f"({mb / cublas:4.2f} TB/s)  skinny {ours:6.2f} us ({mb / ours:4.2f} TB/s) "
                    f"{gemv.gemv_config(n, k) if m == 1 else gemv.skinny_gemm_config(n, k)}")
            if args.sweep:
                grid = ONE_ROW_SWEEP if m == 1 else SWEEP
                best = sorted((skinny_us(x, ws, c), c) for c in grid)[:4]
                line += "  best: " + " ".join(f"{us:.2f}{c}" for us, c in best)
            print(line, flush=True)


if __name__ == "__main__":
    main()
