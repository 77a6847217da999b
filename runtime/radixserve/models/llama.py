"""Llama (Llama 2/3/3.1+ incl. `llama3` rope scaling, SmolLM, SmolLM2)."""

from __future__ import annotations

from typing import Any

from radixserve.models.decoder import AttnOptions, DecoderForCausalLM
from radixserve.models.registry import MODELS, architectures_of


@MODELS.register(*architectures_of(__name__))
class LlamaForCausalLM(DecoderForCausalLM):
    @classmethod
    def attn_options(cls, cfg: Any) -> AttnOptions:
        bias = bool(getattr(cfg, "attention_bias", False))
        return AttnOptions(qkv_bias=bias, o_bias=bias)
