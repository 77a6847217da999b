"""The model classes by architecture name, filled by the architecture modules as they are
imported (`@MODELS.register("LlamaForCausalLM")`); looked up through `architectures.py`."""

from __future__ import annotations

from radixserve.models.base import BaseCausalLM
from radixserve.utils.registry import Registry

MODELS: Registry[type[BaseCausalLM]] = Registry("model architecture")
