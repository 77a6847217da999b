"""Gemma 3 (text: `Gemma3ForCausalLM`, e.g. gemma-3-1b; the language model of the multimodal
`Gemma3ForConditionalGeneration`, 4b-27b, served text-only: `multimodal.py`). On the shared
decoder, with: interleaved local (sliding-window) and global layers (`layer_types`, else every
`sliding_window_pattern`-th layer global), a RoPE per layer kind (local: `rope_local_base_freq`,
unscaled), per-head q/k RMSNorms, RMSNorms that scale by (1 + weight), a norm after attention and
around the MLP, GELU-tanh, embeddings scaled by sqrt(hidden), attention scaled by
`query_pre_attn_scalar`^-1/2 and optional final logit soft-capping."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixserve.layers import RMSNorm, RotaryEmbedding, VocabParallelEmbedding
from radixserve.layers.activation import GeluTanhAndMul
from radixserve.layers.lazy_weight import materialize
from radixserve.layers.utils import check_shape
from radixserve.models import hf_config as hc
from radixserve.models.decoder import (
    AttnOptions,
    DecoderAttention,
    DecoderForCausalLM,
    DecoderLayer,
    DecoderModel,
    DenseMLP,
)
from radixserve.models.registry import MODELS, architectures_of

SLIDING, FULL = "sliding_attention", "full_attention"


class GemmaRMSNorm(RMSNorm):
    """Gemma's norm: x / rms(x) * (1 + weight). The loader stores (1 + weight) * gain, so the
    shared norm (and its kernel) computes it; `gain` folds a constant factor in (the q norm's)."""

    def __init__(self, hidden: int, eps: float, gain: float = 1.0) -> None:
        super().__init__(hidden, eps)
        self.gain = gain

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        check_shape(param, full)
        param.data.copy_((1.0 + materialize(full).float()) * self.gain)


def layer_types(cfg: Any) -> list[str]:
    kinds = getattr(cfg, "layer_types", None)
    if kinds is None:
        pattern = int(getattr(cfg, "sliding_window_pattern", 6))
        kinds = [SLIDING if (i + 1) % pattern else FULL for i in range(cfg.num_hidden_layers)]
    if set(kinds) - {SLIDING, FULL}:
        raise ValueError(f"Gemma 3 layer_types must be {SLIDING} or {FULL}, got {sorted(set(kinds))}")
    return list(kinds)


def check_gemma3(cfg: Any) -> None:
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"Gemma 3 with hidden_activation={act!r} is not supported (gelu_pytorch_tanh)")
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        raise ValueError("attn_logit_softcapping is not supported (Gemma 3 checkpoints leave it null)")
    if getattr(cfg, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention=True is not supported (a causal LM only)")


class Gemma3Attention(DecoderAttention):
    def __init__(self, cfg: Any, layer_id: int, rotary: RotaryEmbedding, opts: AttnOptions) -> None:
        super().__init__(cfg, layer_id, rotary, opts)
        d, eps = hc.head_dim(cfg), hc.rms_norm_eps(cfg)
        # the backends scale q.k by head_dim^-1/2; Gemma by query_pre_attn_scalar^-1/2: q's norm
        # carries the ratio (rotation is linear, so scaling before it is the same)
        q_gain = (d / float(getattr(cfg, "query_pre_attn_scalar", d))) ** 0.5
        self.q_norm = GemmaRMSNorm(d, eps, q_gain)
        self.k_norm = GemmaRMSNorm(d, eps)


class Gemma3Layer(DecoderLayer):
    def __init__(self, cfg: Any, layer_id: int, rotary: RotaryEmbedding, mlp: nn.Module) -> None:
        nn.Module.__init__(self)
        h, eps = cfg.hidden_size, hc.rms_norm_eps(cfg)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.self_attn = Gemma3Attention(cfg, layer_id, rotary, AttnOptions(
            qkv_bias=bool(getattr(cfg, "attention_bias", False)),
            o_bias=bool(getattr(cfg, "attention_bias", False)), qk_norm=True))
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.mlp = mlp

    def after_attn(self, o: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.post_attention_layernorm(self.self_attn.o_proj(o))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Gemma3Model(DecoderModel):
    def __init__(self, cfg: Any, opts: AttnOptions, make_mlp: Any) -> None:
        nn.Module.__init__(self)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_scale = cfg.hidden_size**0.5
        d, n = hc.head_dim(cfg), cfg.max_position_embeddings
        rotary = {k: RotaryEmbedding(cfg, d, n, layer_type=k) for k in (SLIDING, FULL)}
        self.layers = nn.ModuleList(
            Gemma3Layer(cfg, i, rotary[kind], make_mlp(cfg, i))
            for i, kind in enumerate(layer_types(cfg))
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, hc.rms_norm_eps(cfg))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        # NOTE: the scale rounded to the model's dtype first, as transformers does
        return x * torch.tensor(self.embed_scale, dtype=x.dtype)


@MODELS.register(*architectures_of(__name__))
class Gemma3ForCausalLM(DecoderForCausalLM):
    model_cls = Gemma3Model

    def __init__(self, hf_config: Any) -> None:
        super().__init__(hf_config)
        self.final_softcap = getattr(hf_config, "final_logit_softcapping", None)

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        check_gemma3(cfg)

    def make_mlp(self, cfg: Any, layer_id: int) -> nn.Module:
        mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size)
        mlp.act_fn = GeluTanhAndMul()
        return mlp

    def sliding_windows(self) -> tuple[int | None, ...]:
        window = getattr(self.hf_config, "sliding_window", None)
        return tuple(window if k == SLIDING else None for k in layer_types(self.hf_config))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
