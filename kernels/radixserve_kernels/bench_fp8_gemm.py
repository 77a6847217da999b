"""The FP8-weight GEMM against bf16 at decode batch sizes: `python -m
radixserve_kernels.bench_fp8_gemm [--sweep]`. Qwen3-8B's four projections, 1/16/64 rows, µs per
call timed inside a CUDA graph with the weights rotated past L2 (`bench_gemm.graph_us`): bf16
through the layers' own path (the skinny kernel up to 16 rows, cuBLAS above) against the FP8
weight with 128x128 block scales as the layers keep a checkpoint's (one row of scales a block),
with one scale a row and 128 columns (the layers' layout where a piece starts mid-block) and
with per-row scales; above one row also cuBLASLt's block-scaled GEMM (activations quantized per
128 columns, `fp8_blockwise.py`), which the layers take there on Hopper. `--sweep` also tries
a grid of tile configurations for the block-scaled weight, to retune `fp8_gemv_config` (one row)
and `fp8_gemm_config`."""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

from radixserve_kernels import blockwise_fits, blockwise_fp8_gemm, fp8_gemv, gemv
from radixserve_kernels.bench_gemm import COPIES, graph_us, us_with_config

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
          "down_proj": (4096, 12288)}
ROWS = (1, 16, 64)
ONE_ROW_SWEEP = list(itertools.product([4, 8, 16, 32], [512, 1024, 2048], [4, 8], [2, 3, 4, 5]))
TILED_SWEEP = {16: list(itertools.product([16], [16, 32, 64], [128], [4], [3, 4, 6])),
               64: list(itertools.product([32, 64], [32, 64, 128], [128], [4, 8], [3, 4, 6]))}


def fp8_us(x: torch.Tensor, ws: list[torch.Tensor], scales: list[torch.Tensor],
           block: tuple[int, int] | None, config: tuple | None = None) -> float:
    """µs per `fp8_gemm` call; `config` replaces the chosen tiles (None: the chosen ones)."""
    name = "fp8_gemv_config" if x.shape[0] == 1 else "fp8_gemm_config"
    return us_with_config(fp8_gemv, name, config, lambda r: fp8_gemv.fp8_gemm(
        x, ws[r % COPIES], scales[r % COPIES], None, block))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="store_true", help="also try a grid of tile configurations")
    args = p.parse_args()
    for name, (n, k) in SHAPES.items():
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(COPIES)]
        wq = [(w * 64 * 8).clamp(-448, 448).to(torch.float8_e4m3fn) for w in wb]
        blocks = [torch.rand(n, -(-k // 128), device="cuda") / 512 for _ in range(COPIES)]
        squares = [b[::128].contiguous() for b in blocks]
        rows = [torch.rand(n, device="cuda") / 512 for _ in range(COPIES)]
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            def bf16_call(r: int, x: torch.Tensor = x, wb: list[torch.Tensor] = wb) -> torch.Tensor:
                if x.shape[0] <= gemv.SKINNY_MAX_M:  # the layers' path (`layers/linear.py`)
                    return gemv.skinny_gemm(x, wb[r % COPIES], None)
                return F.linear(x, wb[r % COPIES])

            bf16 = graph_us(bf16_call)
            sq = fp8_us(x, wq, squares, (128, 128))
            blk = fp8_us(x, wq, blocks, (1, 128))
            row = fp8_us(x, wq, rows, None)
            line = (f"{name:13s} [{n}x{k}] rows {m:2d}  bf16 {bf16:7.2f} us  fp8 128x128 "
                    f"{sq:7.2f} us ({bf16 / sq:4.2f}x, {n * k / sq / 1e6:4.2f} TB/s)  1x128 "
                    f"{blk:7.2f} us ({bf16 / blk:4.2f}x)  row {row:7.2f} us ({bf16 / row:4.2f}x)")
            if m > 1 and blockwise_fits(x, wq[0], squares[0], (128, 128)):
                cub = graph_us(lambda r, x=x, wq=wq, sq=squares: blockwise_fp8_gemm(
                    x, wq[r % COPIES], sq[r % COPIES]))
                line += f"  cuBLASLt 128x128 {cub:7.2f} us ({bf16 / cub:4.2f}x)"
            if args.sweep:
                grid = ONE_ROW_SWEEP if m == 1 else TILED_SWEEP[m]
                best = sorted((fp8_us(x, wq, squares, (128, 128), c), c) for c in grid)[:4]
                line += "  best: " + " ".join(f"{us:.2f}{c}" for us, c in best)
            print(line, flush=True)


if __name__ == "__main__":
    main()
