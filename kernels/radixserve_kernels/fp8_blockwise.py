"""x @ dequant(W).T for a 128x128 block-FP8 weight on cuBLASLt's block-scaled FP8 GEMM (Hopper):
x is quantized to e4m3 per row and 128 columns (`quantize_groups_fp8`, DeepSeek-V3's and the
`*-FP8` checkpoints' recipe), and the tensor cores multiply both FP8 operands, applying each
128-column group's activation scale and weight-block scale to its partial sums
(`torch._scaled_mm` with 1x128 and 128x128 scales). From a few rows up this beats the
weight-only Triton kernel, which widens every weight in registers; the price is activations
rounded to e4m3 (3 mantissa bits, one scale per 128 values), as in SGLang's and vLLM's FP8 path.

cuBLASLt takes the activation scales column-major and, it turns out, rows in multiples of four
(37 rows: no algorithm): `quantize_groups_fp8` pads x's rows (zeros, scale 1e-12) and the result
is sliced back. See `blockwise_fits` for the weights it takes."""
from __future__ import annotations

import torch

from radixserve_kernels._utils import cdiv, fp8_blockwise_capable, next_pow2, pdl_args
from radixserve_kernels.fp8_gemv import FP8_WEIGHT_DTYPE as FP8
from radixserve_kernels.fp8_gemv import fp8_gemm_ref
from radixserve_kernels.kv_quant import FP8_MAX

GROUP = 128
ROW_ALIGN = 4
_MIN_SCALE = 1e-12


def blockwise_fits(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                   block: tuple[int, int] | None) -> bool:
    """Whether `blockwise_fp8_gemm` takes this product: 128x128 scales [N/128, K/128] of a whole
    number of blocks, on a Hopper GPU, K/128 a multiple of 4: with 2, 3 or 6 column blocks
    cuBLASLt (torch 2.11, CUDA 13) returned wrong products without an error, as if each row of
    scales were padded to four (real models' K/128: 20 to 136, all multiples of 4)."""
    n, k = weight.shape
    return (block == (GROUP, GROUP) and x.is_cuda and n % GROUP == 0 and k % (GROUP * 4) == 0
            and tuple(scale.shape) == (n // GROUP, k // GROUP)
            and fp8_blockwise_capable(x.device.index or 0))


def quantize_groups_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [M, K] in e4m3, float32 scales [M, K / 128]): each row's 128-column groups scaled onto
    e4m3's full range by their largest magnitude."""
    m, k = x.shape
    g = x.float().reshape(m, k // GROUP, GROUP)
    scale = (g.abs().amax(-1) / FP8_MAX).clamp(min=_MIN_SCALE)
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(m, k), scale


def quantize_groups_fp8(x: torch.Tensor, rows: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `quantize_groups_fp8_ref` for x [M, K] (rows may be strided), K a multiple
    of 128; `rows` >= M pads the result with zero rows. The scales come column-major (stride
    (1, rows)), as cuBLASLt reads them."""
    from radixserve_kernels._jit.fp8_quant import quantize_groups_fp8_kernel

    m, k = x.shape
    rows = m if rows is None else rows
    assert k % GROUP == 0 and rows >= m and x.stride(-1) == 1
    q = torch.empty(rows, k, dtype=FP8, device=x.device)
    scale = torch.empty(k // GROUP, rows, dtype=torch.float32, device=x.device).t()
    groups = min(8, next_pow2(k // GROUP))
    quantize_groups_fp8_kernel[(rows, cdiv(k // GROUP, groups))](
        x, q, scale, m, k, x.stride(0), scale.stride(1), GROUP=GROUP, GROUPS=groups,
        num_warps=4, **pdl_args(x))
    return q, scale


def round_groups_fp8_ref(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] in float32 as `quantize_groups_fp8_ref` rounds it: its e4m3 values times their
    group's scale."""
    q, scale = quantize_groups_fp8_ref(x)
    return q.float() * scale.repeat_interleave(GROUP, 1)


def blockwise_fp8_gemm_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
    """What `blockwise_fp8_gemm` computes, in float32: x rounded as `quantize_groups_fp8_ref`
    rounds it, times the dequantized weight."""
    return fp8_gemm_ref(round_groups_fp8_ref(x), weight, scale, bias, (GROUP, GROUP)).to(x.dtype)


def blockwise_fp8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (bf16 or fp16) @ (weight [N, K] e4m3 * 128x128 `scale` [N/128, K/128]).T
    (+ bias) in x's dtype, on cuBLASLt; `blockwise_fits` must hold."""
    m = x.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    q, xs = quantize_groups_fp8(x, cdiv(m, ROW_ALIGN) * ROW_ALIGN)
    # written in bf16 (as the row-wise scaled GEMM, the only output cuBLASLt is asked for here)
    y = torch._scaled_mm(q, weight.t(), scale_a=xs, scale_b=scale.float().t(),
                         out_dtype=torch.bfloat16)[:m].to(x.dtype)
    return y if bias is None else y + bias
