"""Qwen3-MoE: Qwen3 attention; sparse MoE MLP on every `decoder_sparse_step`-th layer except
`mlp_only_layers`, which keep a dense MLP."""

from __future__ import annotations

from typing import Any

from torch import nn

from radixserve.layers import SparseMoeBlock
from radixserve.models.decoder import AttnOptions, DecoderForCausalLM, DenseMLP
from radixserve.models.qwen3 import qwen3_attn_options
from radixserve.models.registry import MODELS, architectures_of


def is_sparse_layer(cfg: Any, layer_id: int) -> bool:
    step = getattr(cfg, "decoder_sparse_step", 1) or 1
    return (
        layer_id not in (getattr(cfg, "mlp_only_layers", None) or [])
        and cfg.num_experts > 0
        and (layer_id + 1) % step == 0
    )


@MODELS.register(*architectures_of(__name__))
class Qwen3MoeForCausalLM(DecoderForCausalLM):
    @classmethod
    def attn_options(cls, cfg: Any) -> AttnOptions:
        return qwen3_attn_options(cfg)

    def make_mlp(self, cfg: Any, layer_id: int) -> nn.Module:
        if not is_sparse_layer(cfg, layer_id):
            return DenseMLP(cfg.hidden_size, cfg.intermediate_size)
        return SparseMoeBlock(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            bool(getattr(cfg, "norm_topk_prob", False)),
        )
