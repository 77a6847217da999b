"""Qwen2 / Qwen2.5: bias on q, k and v (not o)."""

from __future__ import annotations

from typing import Any

from radixserve.models.decoder import AttnOptions, DecoderForCausalLM
from radixserve.models.registry import MODELS, architectures_of


@MODELS.register(*architectures_of(__name__))
class Qwen2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def attn_options(cls, cfg: Any) -> AttnOptions:
        return AttnOptions(qkv_bias=True)
