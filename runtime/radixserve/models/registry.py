"""Architecture name (the HF config's `architectures`) -> model class."""

from __future__ import annotations

import importlib
from typing import Any

from radixserve.models.base import BaseCausalLM
from radixserve.utils.registry import Registry

MODELS: Registry[type[BaseCausalLM]] = Registry("model architecture")
_ARCH_MODULES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3")


def _import_architectures() -> None:
    for name in _ARCH_MODULES:
        importlib.import_module(f"radixserve.models.{name}")


def get_model_class(hf_config: Any) -> type[BaseCausalLM]:
    _import_architectures()
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in MODELS:
            return MODELS.get(arch)
    raise ValueError(
        f"unsupported model architecture {archs or '(config.json lists none)'}; "
        f"supported: {', '.join(MODELS.names())}"
    )
