"""Derived hyper-parameters read from a transformers config, with the defaults transformers uses."""

from __future__ import annotations

from typing import Any


def head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def num_kv_heads(cfg: Any) -> int:
    return getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads


def rms_norm_eps(cfg: Any) -> float:
    return float(getattr(cfg, "rms_norm_eps", 1e-6))


def tie_word_embeddings(cfg: Any) -> bool:
    return bool(getattr(cfg, "tie_word_embeddings", False))


def check_supported(cfg: Any) -> None:
    """Raise for settings our layers do not implement, rather than computing something else."""
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported (only silu)")
    if getattr(cfg, "use_sliding_window", False):
        raise ValueError("use_sliding_window=True is not supported")


def text_config(cfg: Any) -> Any:
    """The language model's config: a multimodal checkpoint's `text_config` (Gemma 3, Mistral 3
    ...ForConditionalGeneration), else `cfg` itself. A transformers config or config.json's dict
    alike; every reader of text hyper-parameters (layers, heads, vocabulary, rope, windows,
    context length) goes through it."""
    inner = cfg.get("text_config") if isinstance(cfg, dict) else getattr(cfg, "text_config", None)
    return inner or cfg
