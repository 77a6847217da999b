"""Tensor-parallel sizing: how many GPUs one replica needs.

A TP size fits when (a) it divides the attention heads, (b) it divides the KV heads or is a
multiple of them (KV heads are then replicated), and (c) on each GPU the weight share plus the KV
cache for `MIN_KV_TOKENS` tokens fits in `memoryRatio x memoryGiB` (the runtime's budget for
weights + KV; activations live in the rest). `auto` picks the smallest fitting of AUTO_SIZES."""

from __future__ import annotations

from radixserve_operator.modelconfig import ModelShape
from radixserve_operator.spec import ServiceSpec

AUTO_SIZES = (1, 2, 4, 8)
MIN_KV_TOKENS = 16384  # two default prefill chunks (8192): room to admit work beyond one request
GiB = 1 << 30


class SizingError(ValueError):
    """No valid TP size for this model and GPU."""


def heads_problem(shape: ModelShape, tp: int) -> str | None:
    if shape.num_attention_heads % tp:
        return f"TP {tp} does not divide the model's {shape.num_attention_heads} attention heads"
    kv = shape.num_kv_heads
    if kv % tp and tp % kv:
        return f"TP {tp} neither divides the model's {kv} KV heads nor is a multiple of them"
    return None


def per_gpu_bytes(shape: ModelShape, tp: int, dtype: str | None, min_kv_tokens: int,
                  kv_dtype: str | None = None) -> int:
    """Weights in `dtype`, KV in `kv_dtype` (default: the weights' dtype)."""
    kv = shape.kv_bytes_per_token(tp, kv_dtype or dtype) * min_kv_tokens
    return -(-shape.weight_bytes(dtype) // tp) + kv


def memory_problem(
    shape: ModelShape, tp: int, budget_bytes: float, dtype: str | None, min_kv_tokens: int,
    kv_dtype: str | None = None,
) -> str | None:
    need = per_gpu_bytes(shape, tp, dtype, min_kv_tokens, kv_dtype)
    if need <= budget_bytes:
        return None
    return (
        f"TP {tp}: {shape.weight_bytes(dtype) / tp / GiB:.1f} GiB of weights plus "
        f"{shape.kv_bytes_per_token(tp, kv_dtype or dtype) * min_kv_tokens / GiB:.1f} GiB of KV cache "
        f"({min_kv_tokens} tokens) per GPU exceed the {budget_bytes / GiB:.1f} GiB budget "
        f"(memoryRatio x memoryGiB)"
    )


def _dtype(spec: ServiceSpec) -> str | None:
    d = spec.runtime.dtype
    return None if d in (None, "auto") else d


def _kv_dtype(spec: ServiceSpec) -> str | None:
    d = spec.runtime.kv_cache_dtype
    return None if d in (None, "auto") else d


def _min_kv_tokens(spec: ServiceSpec) -> int:
    return max(MIN_KV_TOKENS, spec.runtime.max_prefill_length or 0)


def resolve_tp(spec: ServiceSpec, shape: ModelShape | None) -> int:
    """The TP size for `spec`: `auto` sized from `shape`, or an explicit size validated against it.
    Raises `SizingError` with a message for the user."""
    if not spec.gpu.enabled:
        return 1
    if spec.tensor == "auto":
        if shape is None:
            raise SizingError(
                f"spec.parallelism.tensor is auto but the operator cannot read the config of "
                f"{spec.model.source!r}: set spec.model.parameters (shape hints) or an explicit TP"
            )
        sizes: tuple[int, ...] = AUTO_SIZES
    else:
        sizes = (int(spec.tensor),)
    if shape is None:  # explicit TP, model unknown to the operator: trust the user
        return sizes[0]
    budget = spec.runtime.memory_ratio * spec.gpu.memory_gib * GiB if spec.gpu.memory_gib else None
    problems = []
    for tp in sizes:
        problem = heads_problem(shape, tp)
        if problem is None and budget is not None:
            problem = memory_problem(shape, tp, budget, _dtype(spec), _min_kv_tokens(spec),
                                         _kv_dtype(spec))
        if problem is None:
            return tp
        problems.append(problem)
    if spec.tensor == "auto":
        raise SizingError(f"no TP size in {list(AUTO_SIZES)} fits: " + "; ".join(problems))
    raise SizingError(f"spec.parallelism.tensor: {problems[0]}")
