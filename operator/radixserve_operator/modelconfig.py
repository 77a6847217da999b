"""What TP sizing needs to know about a model: its `ModelShape`, read from the hub's config.json,
from `spec.model.parameters` hints, or known for the image's embedded default model.

config.json is parsed as plain JSON rather than through transformers: the operator image stays
slim (no torch), and only a handful of well-known keys matter for a weight and KV-cache estimate."""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from radixserve_operator.crd import MAX_PARAMETERS
from radixserve_operator.spec import ModelSpec, SpecError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8_e4m3": 1}  # fp8: KV cache only
BLOCK_SCALE_BYTES = 4  # a block-FP8 layer keeps one float32 scale per row and column block


class ModelConfigNotFound(ValueError):
    """The hub answered: no such repo, revision or config.json, or no access. Final."""


class ModelConfigUnavailable(RuntimeError):
    """The hub could not be reached; a later retry may succeed."""


@dataclass(frozen=True)
class ModelShape:
    param_count: int
    num_attention_heads: int
    num_kv_heads: int
    num_layers: int
    head_dim: int
    dtype: str = "bfloat16"
    num_experts: int = 0  # 0: dense
    # the decoder layers' linear weights, where the checkpoint's quantization keeps them in fewer
    # bytes on the GPU (`quantized_bytes` each, scales included); the rest is in `dtype`
    quantized_params: int = 0
    quantized_bytes: float = 0.0

    def weight_bytes(self, dtype: str | None = None) -> int:
        rest = (self.param_count - self.quantized_params) * DTYPE_BYTES[dtype or self.dtype]
        return rest + int(self.quantized_params * self.quantized_bytes)

    def kv_bytes_per_token(self, tp: int, dtype: str | None = None) -> int:
        """K and V for every layer on one GPU; KV heads are replicated when tp exceeds them."""
        heads_per_gpu = max(1, self.num_kv_heads // tp)
        return (
            2 * self.num_layers * heads_per_gpu * self.head_dim * DTYPE_BYTES[dtype or self.dtype]
        )


# The image's embedded SmolLM2-135M-Instruct (what `--model` omitted serves).
EMBEDDED_DEFAULT = ModelShape(
    param_count=134_515_008, num_attention_heads=9, num_kv_heads=3, num_layers=30, head_dim=64
)


def _count(
    hidden: int, layers: int, heads: int, kv: int, head_dim: int, cfg: dict[str, Any]
) -> tuple[int, int]:
    """(parameter count, routed experts) from a Llama/Qwen/Mixtral-style config."""
    attn = hidden * head_dim * (2 * heads + 2 * kv)  # q, o and k, v projections
    inter = cfg.get("intermediate_size") or 4 * hidden
    experts = (
        cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    )
    dense_mlp = 3 * hidden * inter  # gate, up, down
    if experts:
        expert_inter = cfg.get("moe_intermediate_size") or inter
        shared = cfg.get("shared_expert_intermediate_size") or 0
        shared += (cfg.get("n_shared_experts") or 0) * expert_inter
        moe_mlp = experts * 3 * hidden * expert_inter + hidden * experts + 3 * hidden * shared
        step = cfg.get("decoder_sparse_step") or 1
        dense_layers = set(cfg.get("mlp_only_layers") or ())
        dense_layers |= set(range(cfg.get("first_k_dense_replace") or 0))
        moe_layers = [i for i in range(layers) if i not in dense_layers and (i + 1) % step == 0]
        mlp = len(moe_layers) * moe_mlp + (layers - len(moe_layers)) * dense_mlp
    else:
        mlp = layers * dense_mlp
    vocab = cfg.get("vocab_size") or 32000
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings", False) else 2)
    return embed + layers * (attn + 2 * hidden) + mlp + hidden, experts


def gpu_bytes_per_quantized_weight(cfg: dict[str, Any]) -> float | None:
    """Bytes a linear weight takes on the GPU under the checkpoint's `quantization_config`, as the
    runtime loads it (`radixserve.models.fp8_weights`), or None for the model's dtype. FP8 stays
    FP8 on the GPU: with per-channel or per-tensor scales (compressed-tensors) 1 byte (plus a
    float32 scale per output row, under 0.1%); block-scaled (`quant_method: fp8`) 1 byte plus a
    float32 scale per row and 128-column block (1/32 byte a weight). Other methods the runtime
    refuses to load."""
    qc = cfg.get("quantization_config") or {}
    if qc.get("quant_method") == "fp8" and qc.get("weight_block_size"):
        return 1.0 + BLOCK_SCALE_BYTES / qc["weight_block_size"][-1]
    if qc.get("quant_method") != "compressed-tensors":
        return None
    groups = list((qc.get("config_groups") or {}).values())
    weights = [g.get("weights") or {} for g in groups]
    if weights and all(w.get("type") == "float" and w.get("num_bits") == 8
                       and w.get("strategy") in ("channel", "tensor") for w in weights):
        return 1.0
    return None


def shape_from_config(cfg: dict[str, Any]) -> ModelShape:
    """A `ModelShape` from a Hugging Face config.json (multimodal configs: their `text_config`)."""
    text = cfg.get("text_config") or cfg
    try:
        hidden, layers, heads = (
            text["hidden_size"],
            text["num_hidden_layers"],
            text["num_attention_heads"],
        )
    except KeyError as e:
        raise ModelConfigNotFound(
            f"config.json has no {e.args[0]!r}: not a decoder LLM config"
        ) from None
    kv = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or hidden // heads
    params, experts = _count(hidden, layers, heads, kv, head_dim, text)
    dtype = str(
        text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    )
    qbytes = gpu_bytes_per_quantized_weight(cfg)
    vocab = text.get("vocab_size") or 32000
    embed = vocab * hidden * (1 if text.get("tie_word_embeddings", False) else 2)
    linear = params - embed - layers * 2 * hidden - hidden  # all but embeddings and norms
    return ModelShape(
        params, heads, kv, layers, head_dim, dtype if dtype in DTYPE_BYTES else "bfloat16", experts,
        quantized_params=linear if qbytes is not None else 0, quantized_bytes=qbytes or 0.0,
    )


_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def parse_param_count(value: int | str) -> int:
    """A weight count (an integer, or "14.8B"); bounded digits, so parsing is cheap, and bounded
    by MAX_PARAMETERS before any arithmetic uses it."""
    m = re.fullmatch(r"([0-9]{1,15}(?:\.[0-9]{1,6})?)([KMBT]?)", str(value)[:32])
    if isinstance(value, bool) or not m:
        raise SpecError(
            "spec.model.parameters.parameterCount: expected e.g. 14800000000 or 14.8B, got "
            f"{str(value)[:32]!r}"
        )
    count = int(Decimal(m.group(1)) * _SUFFIX[m.group(2)])
    if not 1 <= count <= MAX_PARAMETERS:
        raise SpecError(
            f"spec.model.parameters.parameterCount: {count:.3g} is out of range (1 to "
            f"{MAX_PARAMETERS:.0e})"
        )
    return count


def shape_from_hints(hints: dict[str, Any]) -> ModelShape:
    heads = int(hints["numAttentionHeads"])
    return ModelShape(
        param_count=parse_param_count(hints["parameterCount"]),
        num_attention_heads=heads,
        num_kv_heads=int(hints.get("numKeyValueHeads") or heads),
        num_layers=int(hints["numHiddenLayers"]),
        head_dim=int(hints["headDim"]),
        dtype=hints.get("dtype") or "bfloat16",
    )


UNREACHABLE_TTL_S = 300.0  # how long an unreachable hub is believed before asking again
_unreachable: dict[tuple[str, str | None, str | None], tuple[float, str]] = {}


def fetch_config(
    repo_id: str, revision: str | None = None, endpoint: str | None = None
) -> dict[str, Any]:
    """config.json of a hub model (HF_TOKEN, HF_ENDPOINT from the environment); cached. An
    unreachable hub is remembered for `UNREACHABLE_TTL_S`: each attempt costs ~25 s of the hub
    client's retries, and an air-gapped cluster would pay them on every reconcile."""
    key = (repo_id, revision, endpoint)
    seen = _unreachable.get(key)
    if seen is not None and time.monotonic() - seen[0] < UNREACHABLE_TTL_S:
        raise ModelConfigUnavailable(seen[1])
    try:
        return _fetch_config(repo_id, revision, endpoint)
    except ModelConfigUnavailable as e:
        _unreachable[key] = (time.monotonic(), str(e))
        raise


@functools.lru_cache(maxsize=256)
def _fetch_config(repo_id: str, revision: str | None, endpoint: str | None) -> dict[str, Any]:
    from huggingface_hub import errors, hf_hub_download

    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        tempfile.gettempdir(), "radixserve-operator-hf"
    )
    try:
        path = hf_hub_download(
            repo_id, "config.json", revision=revision, cache_dir=cache, endpoint=endpoint
        )
    except errors.LocalEntryNotFoundError as e:  # raised when the hub cannot be reached
        raise ModelConfigUnavailable(
            f"cannot reach the Hugging Face hub for {repo_id!r}: {e}"
        ) from None
    except (
        errors.RepositoryNotFoundError,
        errors.RevisionNotFoundError,
        errors.EntryNotFoundError,
    ) as e:
        raise ModelConfigNotFound(
            f"no config.json for {repo_id!r} at revision {revision or 'main'} on the hub "
            f"(missing, gated or private: set HF_TOKEN for the operator, or spec.model.parameters): "
            f"{type(e).__name__}"
        ) from None
    except errors.HFValidationError as e:
        raise ModelConfigNotFound(
            f"spec.model.source {repo_id!r} is not a valid hub id: {e}"
        ) from None
    except Exception as e:  # noqa: BLE001 -- any fetch failure is reported on the resource
        raise ModelConfigUnavailable(
            f"cannot fetch config.json of {repo_id!r}: {type(e).__name__}: {e}"
        ) from None
    with open(path) as f:
        return json.load(f)


def resolve_shape(
    model: ModelSpec, fetch: Callable[[str, str | None], dict[str, Any]] = fetch_config
) -> ModelShape | None:
    """The model's shape, or None when the operator cannot know it (a path or pvc:// source
    without hints): hints first, then the embedded default, then the hub."""
    if model.hints:
        return shape_from_hints(model.hints)
    if model.is_default:
        return EMBEDDED_DEFAULT
    if model.hub_id is None:
        return None
    return shape_from_config(fetch(model.hub_id, model.revision))
