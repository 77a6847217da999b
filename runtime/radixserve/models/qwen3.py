"""Qwen3: per-head RMSNorm on q and k before rope."""

from __future__ import annotations

from typing import Any

from radixserve.models.decoder import AttnOptions, DecoderForCausalLM
from radixserve.models.registry import MODELS, architectures_of


def qwen3_attn_options(cfg: Any) -> AttnOptions:
    bias = bool(getattr(cfg, "attention_bias", False))
    return AttnOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)


@MODELS.register(*architectures_of(__name__))
class Qwen3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def attn_options(cls, cfg: Any) -> AttnOptions:
        return qwen3_attn_options(cfg)
