"""Architecture name (the HF config's `architectures`) -> model class: the module `registry.py`
names for it is imported on the first lookup, and registers the class as it loads."""

from __future__ import annotations

import importlib
from typing import Any

from radixserve.models.base import BaseCausalLM
from radixserve.models.registry import ARCHITECTURES, MODELS, supported_architecture


def get_model_class(hf_config: Any) -> type[BaseCausalLM]:
    arch = supported_architecture(hf_config)
    importlib.import_module(ARCHITECTURES[arch])
    return MODELS.get(arch)
