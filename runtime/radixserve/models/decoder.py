"""The pre-norm decoder shared by Llama, Qwen2, Qwen3 and Qwen3-MoE. Architectures differ only in
attention biases, QK-norm and which MLP a layer gets; they subclass `DecoderForCausalLM`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixserve.kvcache.kv_scales import SKIP_WHEN_LOADING as KV_SCALE_NAMES
from radixserve.layers import (
    AttentionLayer,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    SiluAndMul,
    VocabParallelEmbedding,
)
from radixserve.models import hf_config as hc
from radixserve.models.base import BaseCausalLM
from radixserve.models.weights import WeightNameMap, load_named_weights
from radixserve.utils import kernel_path


@dataclass(frozen=True)
class AttnOptions:
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before rope


class DecoderAttention(nn.Module):
    def __init__(self, cfg: Any, layer_id: int, rotary: RotaryEmbedding, opts: AttnOptions) -> None:
        super().__init__()
        head_dim = hc.head_dim(cfg)
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, head_dim, cfg.num_attention_heads, hc.num_kv_heads(cfg), opts.qkv_bias
        )
        self.o_proj = RowParallelLinear(
            cfg.num_attention_heads * head_dim, cfg.hidden_size, opts.o_bias
        )
        self.q_norm = RMSNorm(head_dim, hc.rms_norm_eps(cfg)) if opts.qk_norm else None
        self.k_norm = RMSNorm(head_dim, hc.rms_norm_eps(cfg)) if opts.qk_norm else None
        self.rotary_emb = rotary
        self.attn = AttentionLayer(
            layer_id, self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, head_dim
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        # on the kernel path the rotary launch also stores k/v in the KV pool (one launch fewer)
        dest = self.attn.kv_destination() if kernel_path.use_triton(q) else None
        q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm, v, dest)
        return self.o_proj(self.attn(q, k, v, kv_stored=dest is not None))


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate], bias)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: Any, layer_id: int, rotary: RotaryEmbedding, opts: AttnOptions, mlp: nn.Module
    ) -> None:
        super().__init__()
        eps = hc.rms_norm_eps(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = DecoderAttention(cfg, layer_id, rotary, opts)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = mlp

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: Any, opts: AttnOptions, make_mlp: Any) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        rotary = RotaryEmbedding(cfg, hc.head_dim(cfg), cfg.max_position_embeddings)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, rotary, opts, make_mlp(cfg, i))
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, hc.rms_norm_eps(cfg))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]


class DecoderForCausalLM(BaseCausalLM):
    """Subclasses choose `attn_options` and, if not dense, `make_mlp`."""

    weight_names = WeightNameMap()

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        hc.check_supported(hf_config)
        self.hf_config = hf_config
        self.model = DecoderModel(hf_config, self.attn_options(hf_config), self.make_mlp)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        self.tied = hc.tie_word_embeddings(hf_config)
        self.on_materialized()

    @classmethod
    def attn_options(cls, cfg: Any) -> AttnOptions:
        return AttnOptions()

    def make_mlp(self, cfg: Any, layer_id: int) -> nn.Module:
        return DenseMLP(
            cfg.hidden_size, cfg.intermediate_size, bool(getattr(cfg, "mlp_bias", False))
        )

    def on_materialized(self) -> None:
        """Re-tie the LM head to the embedding: `to_empty` gives each module its own new tensor."""
        if self.tied:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # KV-cache scales are read by the engine (`kvcache/kv_scales.py`), not by a layer
        skip = ("rotary_emb.inv_freq", *KV_SCALE_NAMES) + (("lm_head.",) if self.tied else ())
        load_named_weights(self, weights, self.weight_names, skip)
