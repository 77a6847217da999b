"""Architecture name (the HF config's `architectures`) -> model class. The architecture modules
register themselves in `MODELS` when imported; this module imports them (all, on the first lookup),
so the registry never imports the modules that fill it."""

from __future__ import annotations

import importlib
from typing import Any

from radixserve.models.base import BaseCausalLM
from radixserve.models.registry import MODELS

# NOTE: full names, so that the import-graph test sees these imports too
ARCH_MODULES = (
    "radixserve.models.llama",
    "radixserve.models.mistral",
    "radixserve.models.qwen2",
    "radixserve.models.qwen3",
    "radixserve.models.qwen3_moe",
    "radixserve.models.gemma3",
)


def get_model_class(hf_config: Any) -> type[BaseCausalLM]:
    for module in ARCH_MODULES:
        importlib.import_module(module)
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in MODELS:
            return MODELS.get(arch)
    raise ValueError(
        f"unsupported model architecture {archs or '(config.json lists none)'}; "
        f"supported: {', '.join(MODELS.names())}"
    )
