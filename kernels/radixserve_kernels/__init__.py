"""GPU kernels for radixserve, written in Triton, each paired with a pure-torch `*_ref` twin of
the same signature (the reference the tests compare against, and the CPU path).

Importing this package never imports triton: kernel bodies live in `_jit/` and are loaded on the
first launch. `triton_usable(tensor)` says whether the Triton twin can run on a tensor.
"""
from __future__ import annotations

from radixserve_kernels._utils import pdl_enabled, set_pdl, triton_usable
from radixserve_kernels.activation import silu_and_mul, silu_and_mul_ref
from radixserve_kernels.argmax import TokenStore, argmax_rows, argmax_rows_ref, store_tokens_ref
from radixserve_kernels.decode_attention import (
    NewTokenKV,
    RopeParams,
    decode_attention,
    decode_attention_ref,
    decode_num_splits,
    decode_order,
    decode_order_cpu,
    decode_rope_fusable,
)
from radixserve_kernels.extend_attention import extend_attention, extend_attention_ref
from radixserve_kernels.fp8_blockwise import (
    blockwise_fits,
    blockwise_fp8_gemm,
    blockwise_fp8_gemm_ref,
    quantize_groups_fp8,
    quantize_groups_fp8_ref,
    round_groups_fp8_ref,
)
from radixserve_kernels.fp8_gemv import fp8_gemm, fp8_gemm_ref
from radixserve_kernels.gemv import (
    SKINNY_MAX_M,
    silu_mul_gemv,
    silu_mul_gemv_ref,
    skinny_gemm,
    skinny_gemm_ref,
)
from radixserve_kernels.kv_quant import dequantize_kv_ref, quantize_kv_ref
from radixserve_kernels.lora import (
    LoRAGroups,
    lora_expand_,
    lora_expand_ref,
    lora_gemv,
    lora_gemv_ref,
    lora_groups,
    lora_shrink,
    lora_shrink_ref,
)
from radixserve_kernels.moe import (
    fused_moe,
    fused_moe_ref,
    moe_align,
    topk_softmax,
    topk_softmax_ref,
)
from radixserve_kernels.page_indices import page_indices, page_indices_ref
from radixserve_kernels.rmsnorm import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from radixserve_kernels.rotary import (
    apply_rotary_ref,
    build_cos_sin_cache,
    qk_norm_rope_,
    qk_norm_rope_ref,
)
from radixserve_kernels.store_kv import store_kv, store_kv_ref

__all__ = [
    "SKINNY_MAX_M",
    "LoRAGroups",
    "NewTokenKV",
    "RopeParams",
    "TokenStore",
    "apply_rotary_ref",
    "argmax_rows",
    "argmax_rows_ref",
    "blockwise_fits",
    "blockwise_fp8_gemm",
    "blockwise_fp8_gemm_ref",
    "build_cos_sin_cache",
    "decode_attention",
    "decode_attention_ref",
    "decode_num_splits",
    "decode_order",
    "decode_order_cpu",
    "decode_rope_fusable",
    "dequantize_kv_ref",
    "extend_attention",
    "extend_attention_ref",
    "fp8_gemm",
    "fp8_gemm_ref",
    "fused_add_rms_norm",
    "fused_add_rms_norm_ref",
    "fused_moe",
    "fused_moe_ref",
    "lora_expand_",
    "lora_expand_ref",
    "lora_gemv",
    "lora_gemv_ref",
    "lora_groups",
    "lora_shrink",
    "lora_shrink_ref",
    "moe_align",
    "page_indices",
    "page_indices_ref",
    "pdl_enabled",
    "qk_norm_rope_",
    "qk_norm_rope_ref",
    "quantize_groups_fp8",
    "quantize_groups_fp8_ref",
    "quantize_kv_ref",
    "rms_norm",
    "rms_norm_ref",
    "round_groups_fp8_ref",
    "set_pdl",
    "silu_and_mul",
    "silu_and_mul_ref",
    "silu_mul_gemv",
    "silu_mul_gemv_ref",
    "skinny_gemm",
    "skinny_gemm_ref",
    "store_kv",
    "store_kv_ref",
    "store_tokens_ref",
    "topk_softmax",
    "topk_softmax_ref",
    "triton_usable",
]
