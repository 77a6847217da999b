"""Mistral (7B v0.1-v0.3, Nemo, Small; the language model of the multimodal
`Mistral3ForConditionalGeneration`, Small 3.1/3.2, served text-only: `multimodal.py`): Llama's
layers; v0.1 attends within a sliding window in every layer (`sliding_window`), later versions set
it to null (full attention)."""

from __future__ import annotations

from radixserve.models.llama import LlamaForCausalLM
from radixserve.models.registry import MODELS, architectures_of


@MODELS.register(*architectures_of(__name__))
class MistralForCausalLM(LlamaForCausalLM):
    def sliding_windows(self) -> tuple[int | None, ...]:
        window = getattr(self.hf_config, "sliding_window", None)
        return () if window is None else (int(window),) * self.hf_config.num_hidden_layers
