"""The architectures this engine runs: each name (a checkpoint's `architectures` in config.json)
and the module that implements it, declared once here; each module registers its class for its
names (`@MODELS.register(*architectures_of(__name__))`) when imported, and `architectures.py`
imports it on first use. The names alone need no torch, so the command line checks a model's
architecture before anything heavy is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.utils.registry import Registry

if TYPE_CHECKING:
    from radixserve.models.base import BaseCausalLM

ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "radixserve.models.llama",
    "MistralForCausalLM": "radixserve.models.mistral",
    "Mistral3ForConditionalGeneration": "radixserve.models.mistral",  # multimodal.py
    "Qwen2ForCausalLM": "radixserve.models.qwen2",
    "Qwen3ForCausalLM": "radixserve.models.qwen3",
    "Qwen3MoeForCausalLM": "radixserve.models.qwen3_moe",
    "Gemma3ForCausalLM": "radixserve.models.gemma3",
    "Gemma3ForConditionalGeneration": "radixserve.models.gemma3",  # multimodal.py
}
MODELS: Registry[type[BaseCausalLM]] = Registry("model architecture")


def architectures_of(module: str) -> tuple[str, ...]:
    """The architecture names `module` implements."""
    return tuple(name for name, m in ARCHITECTURES.items() if m == module)


def supported_architecture(hf_config) -> str:
    """The first of the config's `architectures` this engine runs; ValueError naming what is
    supported otherwise."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in ARCHITECTURES:
            return arch
    raise ValueError(
        f"unsupported model architecture {archs or '(config.json lists none)'}; "
        f"supported: {', '.join(sorted(ARCHITECTURES))}"
    )
