"""`x @ dequant(W).T (+ b)` with W kept in FP8 (e4m3): weight-only dequantization in registers.

The weight is read as stored (one byte a weight, half of bf16's: what a decode step at small batch
spends its time on), widened inside the kernel (every e4m3 value is exact in bf16, fp16 and fp32),
and each product is scaled in float32 by the weight's scale:

- per output row: `scale` [N] (per-channel, or a per-tensor scale repeated), applied once per
  output at the end;
- per block: `scale` [ceil(N / bn), ceil(K / bk)] for `block=(bn, bk)`, `W_real = W_fp8 * scale`
  over each bn x bk tile (Hugging Face `weight_scale_inv`). `block=(1, bk)` takes one scale per
  row and bk columns (a layer's scales after its rows were cut or fused, `layers/fp8_linear.py`).

Activations are not quantized: the result is the reference's `x @ (W_fp8 * scale).T` up to float32
summation order. One row takes a kernel without tensor cores (as `gemv.py`) whose loop is
software-pipelined, the weight's tiles streamed into shared memory by TMA where the GPU has it;
more rows a tiled `tl.dot` kernel whose programs each stream a slab of weight rows for up to
BLOCK_M rows of x.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixserve_kernels._utils import cdiv, dot_precision, pdl_args, tma_capable

if TYPE_CHECKING:
    from triton.tools.tensor_descriptor import TensorDescriptor

FP8_WEIGHT_DTYPE = torch.float8_e4m3fn


def expand_scale(scale: torch.Tensor, shape: tuple[int, int],
                 block: tuple[int, int] | None) -> torch.Tensor:
    """The scale of every weight element, float32 [N, K] (a row scale broadcast as [N, 1])."""
    n, k = shape
    if block is None:
        return scale.float().reshape(n, 1)
    bn, bk = block
    return scale.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def fp8_gemm_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None,
                 block: tuple[int, int] | None = None) -> torch.Tensor:
    w = weight.float() * expand_scale(scale, tuple(weight.shape), block)
    return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)


def fp8_gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, stages) of the one-row kernel for an [n, k] FP8 weight, from
    a sweep of Qwen3-8B's projections (`bench_fp8_gemm --sweep`): four warps, 8 rows of 1,024
    columns a step, the loop pipelined three deep (unpipelined, each step's DRAM latency was
    exposed; deeper, the tiles' shared memory cost occupancy)."""
    return 8, 1024, 4, 3


def fp8_gemm_config(m: int, n: int, k: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the tiled kernel at m rows. BLOCK_K
    is an upper bound: a block-scaled weight's steps stay inside one scale group (128 columns)."""
    if m <= 16:
        return (16, 32, 256, 4, 4) if k >= 2048 or n < 6144 else (16, 64, 256, 4, 4)
    if m <= 64:
        return 64, 64, 128, 4, 4
    return 128, 128, 128, 8, 3


def _tile_k(group_k: int, cap: int) -> int:
    """The widest power of two that divides `group_k` and is at most `cap`: a kernel step's
    columns, inside one scale group."""
    return min(group_k & -group_k, cap)


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             bias: torch.Tensor | None = None,
             block: tuple[int, int] | None = None) -> torch.Tensor:
    """Triton twin of `fp8_gemm_ref` for x [M, K] (rows may be strided, last dim contiguous) in
    bf16, fp16 or fp32 and an FP8 weight [N, K], contiguous; y [M, N] in x's dtype."""
    from radixserve_kernels._jit.fp8_gemv import fp8_gemm_kernel

    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k, f"x has {k} columns, the weight {weight.shape[1]}"
    layout = _scale_layout(weight, scale, block)
    scale, (scale_n, group_k, s_sn) = layout[0], layout[1:]
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    if m == 1:
        return _fp8_gemv(x, weight, layout, bias, y)
    block_m, block_n, block_k, warps, stages = fp8_gemm_config(m, n, k)
    if group_k:
        block_k = _tile_k(group_k, block_k)
        if block_k < 16:
            raise ValueError(f"block scales over {group_k} columns: tl.dot needs steps of 16 "
                             "columns inside one scale group")
    fp8_gemm_kernel[(cdiv(n, block_n), cdiv(m, block_m))](
        x, weight, scale, bias if bias is not None else scale, y, m, n, k, x.stride(0),
        weight.stride(0), y.stride(0), s_sn,
        SCALE_N=scale_n, GROUP_K=group_k, HAS_BIAS=bias is not None,
        PRECISION=dot_precision(x.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages, **pdl_args(x),
    )
    return y


def _scale_layout(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None
                  ) -> tuple[torch.Tensor, int, int, int]:
    """(float32 scales, rows a scale covers, columns a scale covers (0: the whole row), the
    scales' row stride), checked against the weight [N, K]."""
    assert weight.dtype == FP8_WEIGHT_DTYPE and weight.is_contiguous(), "a contiguous e4m3 weight"
    n, k = weight.shape
    scale = scale.float()
    if block is None:
        assert scale.numel() == n, f"a row scale needs {n} values, got {tuple(scale.shape)}"
        return scale.reshape(n).contiguous(), 1, 0, 1
    want = (cdiv(n, block[0]), cdiv(k, block[1]))
    assert tuple(scale.shape) == want, f"block scales {tuple(scale.shape)}, expected {want}"
    assert scale.stride(1) == 1, "block scales must be contiguous along K"
    return scale, block[0], block[1], scale.stride(0)


def _fp8_gemv(x: torch.Tensor, weight: torch.Tensor, layout: tuple[torch.Tensor, int, int, int],
              bias: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """The one-row kernel into y [1, N]."""
    from radixserve_kernels._jit.fp8_gemv import fp8_gemv_kernel

    n, k = weight.shape
    scale, scale_n, group_k, s_sn = layout
    block_n, block_k, warps, stages = fp8_gemv_config(n, k)
    tile_k = block_k if group_k == 0 else _tile_k(group_k, block_k)
    w = weight_tiles(weight, block_n, block_k)
    fp8_gemv_kernel[(cdiv(n, block_n),)](
        x, w, scale, bias if bias is not None else scale, y, n, k,
        weight.stride(0), s_sn, SCALE_N=scale_n, GROUP_K=group_k, HAS_BIAS=bias is not None,
        BLOCK_N=block_n, GROUPS=block_k // tile_k, TILE_K=tile_k, STAGES=stages,
        TMA=w is not weight, num_warps=warps, **pdl_args(x),
    )
    return y


def weight_tiles(weight: torch.Tensor, block_n: int,
                 block_k: int) -> torch.Tensor | TensorDescriptor:
    """The weight as the one-row kernel reads it: a TMA descriptor of [block_n, block_k] tiles
    where the device has the Tensor Memory Accelerator (Hopper and later; the interpreter
    emulates it) and the rows start 16-byte aligned, else the weight itself, read through
    pointers. The descriptor is built per call: the launch encodes it either way, and a CUDA
    graph keeps the encoded copy."""
    if not (tma_capable(weight) and weight.shape[1] % 16 == 0 and weight.data_ptr() % 16 == 0):
        return weight
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(weight, [block_n, block_k])
