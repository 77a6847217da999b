"""The pre-norm decoder shared by Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE and Gemma 3.
Architectures differ in attention biases, QK-norm, which MLP a layer gets and, for Gemma 3, the
layer itself (`model_cls`); they subclass `DecoderForCausalLM`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from radixserve.core.context import get_context
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


class AttnInputs(NamedTuple):
    """What one layer's attention reads: q [T, Hq*D] and k/v [T, Hkv*D] (views of the fused qkv
    projection), whether k/v are already in the KV pool, and the residual stream [T, H]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_stored: bool
    residual: torch.Tensor
    rope_in_attention: bool = False  # q/k unrotated: the decode kernel rotates and stores them


class PieceBuffers(NamedTuple):
    """Where a prefill graph's piece writes what outlives it (`DecoderModel.piece`): the qkv
    projection [T, (Hq+2Hkv)*D], the residual [T, H], and the last piece's hidden states [T, H]."""

    qkv: torch.Tensor
    residual: torch.Tensor
    hidden: torch.Tensor


class HiddenCapture:
    """Where a model leaves the hidden states entering some of its layers (the residual stream
    there; the embeddings for layer 0) for an EAGLE-3 drafter (`speculative/eagle3.py`): every
    token a forward computes writes them at its KV slot, `store` [slots, len(layers), H], so a
    row is as valid as the KV at the same slot (a cached prefix's rows included). Eager forwards
    only: the engine runs no CUDA graph while a capture is set."""

    def __init__(self, layers: tuple[int, ...], store: torch.Tensor) -> None:
        assert len(store.shape) == 3 and store.shape[1] == len(layers)
        self.layers, self.store = layers, store

    def take(self, layer: int, hidden: torch.Tensor) -> None:
        batch = get_context().batch
        assert batch is not None, "a capture outside a forward"
        self.store[batch.out_loc, self.layers.index(layer)] = hidden.to(self.store.dtype)


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

    def project(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor,
                qkv_out: torch.Tensor | None = None) -> AttnInputs:
        """q, k, v of x, normed and rotated (into `qkv_out` when given), with the residual
        stream that passes around this attention."""
        q, k, v = self.qkv_proj.split(self.qkv_proj(x, qkv_out))
        kernels = kernel_path.use_triton(q)
        if kernels and self.attn.fuses_rope():  # a decode kernel does it all (one launch fewer)
            return AttnInputs(q, k, v, False, residual, rope_in_attention=True)
        # on the kernel path the rotary launch also stores k/v in the KV pool (one launch fewer)
        dest = self.attn.kv_destination() if kernels else None
        q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm, v, dest)
        return AttnInputs(q, k, v, dest is not None, residual)

    def attend(self, a: AttnInputs, out: torch.Tensor | None = None) -> torch.Tensor:
        rope = self.rotary_emb.decode_rope(self.q_norm, self.k_norm) if a.rope_in_attention else None
        return self.attn(a.q, a.k, a.v, a.kv_stored, out, rope)


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate], bias)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if type(self.act_fn) is SiluAndMul and self.down_proj.fuses_silu_mul(gate_up):
            return self.down_proj.forward_silu_mul(gate_up)  # the activation inside the projection
        return self.down_proj(self.act_fn(gate_up))


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

    def before_attn(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                    bufs: PieceBuffers | None = None) -> AttnInputs:
        """x: the previous layer's output (the embeddings, with residual None, for layer 0)."""
        if residual is None:
            residual = x if bufs is None else bufs.residual.copy_(x)
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(
                x, residual, residual_out=None if bufs is None else bufs.residual)
        return self.self_attn.project(positions, x, residual, None if bufs is None else bufs.qkv)

    def after_attn(self, o: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's output, the residual stream) from its attention output o [T, Hq*D]."""
        x, residual = self.post_attention_layernorm(self.self_attn.o_proj(o), residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    capture: HiddenCapture | None = None  # set by an EAGLE-3 drafter on its target

    def __init__(self, cfg: Any, opts: AttnOptions, make_mlp: Any) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        rotary = RotaryEmbedding(cfg, hc.head_dim(cfg), cfg.max_position_embeddings)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, rotary, opts, make_mlp(cfg, i))
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, hc.rms_norm_eps(cfg))

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    def piece(self, i: int, input_ids: torch.Tensor, positions: torch.Tensor,
              o: torch.Tensor | None, residual: torch.Tensor | None,
              bufs: PieceBuffers | None = None) -> AttnInputs | torch.Tensor:
        """The model between two attention calls. Piece 0 embeds `input_ids` and projects layer
        0's q/k/v; piece i finishes layer i-1 from its attention output `o` and the residual, then
        projects layer i's; the last piece (i = len(layers)) finishes the last layer and returns
        the final hidden states [T, H]. With `bufs` (a prefill graph) every output that outlives
        the piece is written to those buffers, so each captured graph leaves it where the next
        reads it."""
        if i == 0:
            x, residual = self.embed(input_ids), None
        else:
            assert o is not None and residual is not None, "piece i > 0 needs layer i-1's attention"
            x, residual = self.layers[i - 1].after_attn(o, residual)
        if self.capture is not None and i in self.capture.layers:
            self.capture.take(i, x if residual is None else x + residual)
        if i == len(self.layers):
            return self.norm(x, residual, out=None if bufs is None else bufs.hidden)[0]
        return self.layers[i].before_attn(positions, x, residual, bufs)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def attend(self, i: int, a: AttnInputs, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.layers[i].self_attn.attend(a, out)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        a = self.piece(0, input_ids, positions, None, None)
        for i in range(len(self.layers)):
            a = self.piece(i + 1, input_ids, positions, self.attend(i, a), a.residual)
        return a


class DecoderForCausalLM(BaseCausalLM):
    """Subclasses choose `attn_options`, if not dense `make_mlp`, if windowed
    `sliding_windows`, and where layers differ, `model_cls`."""

    weight_names = WeightNameMap()
    model_cls: type[DecoderModel] = DecoderModel

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        self.check_config(hf_config)
        self.hf_config = hf_config
        self.model = self.model_cls(hf_config, self.attn_options(hf_config), self.make_mlp)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        self.tied = hc.tie_word_embeddings(hf_config)
        self.on_materialized()

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Raise for settings the layers do not implement, rather than computing something else."""
        hc.check_supported(cfg)

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

    def warm_up_logits(self, max_rows: int) -> None:
        self.lm_head.warm_up(max_rows)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # KV-cache scales are read by the engine (`kvcache/kv_scales.py`), not by a layer
        skip = ("rotary_emb.inv_freq", *KV_SCALE_NAMES) + (("lm_head.",) if self.tied else ())
        load_named_weights(self, weights, self.weight_names, skip)
