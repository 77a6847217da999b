"""An EAGLE-3 draft head as published on Hugging Face (`LlamaForCausalLMEagle3`: SafeAILab's
EAGLE-3, SGLang's and SpecForge's heads for Llama 3.1 and Qwen3): its checkpoint's format, checked
against the target before anything loads, and the head itself.

The checkpoint holds one Llama decoder layer, `midlayer.*`, whose attention reads 2H features:
`concat(input_layernorm(embed(token)), hidden_norm(hidden))`; its residual stream starts from the
hidden state (`norm_before_residual`: from the normed one). `fc` [H, 3 * target_hidden_size] turns
the target's three auxiliary hidden states (those entering the target layers of `aux_layers`) into
the first hidden state; later steps feed the head its own output before the final `norm`.
`lm_head` scores the draft vocabulary (`draft_vocab_size` tokens); draft id d is target id
d + d2t[d]. `embed_tokens` is the target's unless the checkpoint has its own; `t2d` (the inverse
map, as a mask) is not needed to draft greedily."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from radixserve.layers import (
    ParallelLMHead,
    QKVParallelLinear,
    ReplicatedLinear,
    RMSNorm,
    RotaryEmbedding,
    VocabParallelEmbedding,
)
from radixserve.models import hf_config as hc
from radixserve.models.decoder import AttnOptions, DecoderAttention, DenseMLP
from radixserve.models.weights import WeightNameMap, load_named_weights
from radixserve.utils.checkpoint_files import safetensors_files

FIELD = "speculative_draft_model_path"
D2T, T2D, EMBED = "d2t", "t2d", "embed_tokens.weight"


def aux_layers(head_cfg: Any, num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose input hidden states the head reads, in order: those after
    `eagle_config.eagle_aux_hidden_state_layer_ids` (a layer's output is the next one's input),
    else the reference implementations' default, the inputs of layers 2, L // 2 and L - 3."""
    eagle = getattr(head_cfg, "eagle_config", None) or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    n = num_target_layers
    layers = (2, n // 2, n - 3) if ids is None else tuple(int(i) + 1 for i in ids)
    if len(set(layers)) != 3 or not all(0 <= i < n for i in layers):
        raise ValueError(f"{FIELD}: an EAGLE-3 head reads the hidden states entering 3 distinct "
                         f"target layers, here {list(layers)} of a target with {n} layers (set "
                         "eagle_config.eagle_aux_hidden_state_layer_ids in its config.json)")
    return tuple(sorted(layers))


@dataclass(frozen=True)
class HeadShape:
    """What a head's config and its target's say its tensors must be."""

    hidden: int
    target_hidden: int
    draft_vocab: int
    target_vocab: int
    tensors: dict[str, tuple[int, ...]]  # every required tensor's shape
    optional: dict[str, tuple[int, ...]]  # present or not (d2t where the vocabularies agree)

    @classmethod
    def of(cls, cfg: Any, target_cfg: Any) -> HeadShape:
        if int(getattr(cfg, "num_hidden_layers", 1)) != 1:
            raise ValueError(f"{FIELD}: EAGLE-3 heads of {cfg.num_hidden_layers} layers are not "
                             "supported (one: `midlayer`)")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ValueError(f"{FIELD}: hidden_act={cfg.hidden_act!r} is not supported (only silu)")
        h, inter = int(cfg.hidden_size), int(cfg.intermediate_size)
        th = int(getattr(cfg, "target_hidden_size", None) or h)
        if th != int(target_cfg.hidden_size):
            raise ValueError(f"{FIELD}: the head reads hidden states of {th} features, the "
                             f"target's have {target_cfg.hidden_size}")
        vocab = int(target_cfg.vocab_size)
        if int(cfg.vocab_size) != vocab:
            raise ValueError(f"{FIELD}: the head's vocab_size {cfg.vocab_size} is not the "
                             f"target's ({vocab})")
        dv = int(getattr(cfg, "draft_vocab_size", None) or vocab)
        if dv > vocab:
            raise ValueError(f"{FIELD}: draft_vocab_size {dv} is larger than the target's "
                             f"vocabulary ({vocab})")
        d, q, kv = hc.head_dim(cfg), cfg.num_attention_heads, hc.num_kv_heads(cfg)
        t: dict[str, tuple[int, ...]] = {"fc.weight": (h, 3 * th)}
        if getattr(cfg, "bias", False):
            t["fc.bias"] = (h,)
        m = "midlayer."
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            t[f"{m}{name}.weight"] = (h,)
        for name, rows in (("q_proj", q * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            t[f"{m}self_attn.{name}.weight"] = (rows, 2 * h)
            if getattr(cfg, "attention_bias", False):
                t[f"{m}self_attn.{name}.bias"] = (rows,)
        t[f"{m}self_attn.o_proj.weight"] = (h, q * d)
        if getattr(cfg, "attention_bias", False):
            t[f"{m}self_attn.o_proj.bias"] = (h,)
        t[f"{m}mlp.gate_proj.weight"] = (inter, h)
        t[f"{m}mlp.up_proj.weight"] = (inter, h)
        t[f"{m}mlp.down_proj.weight"] = (h, inter)
        t["norm.weight"] = (h,)
        t["lm_head.weight"] = (dv, h)
        optional: dict[str, tuple[int, ...]] = {T2D: (vocab,), EMBED: (vocab, h)}
        (t if dv != vocab else optional)[D2T] = (dv,)
        return cls(h, th, dv, vocab, t, optional)

    def check(self, found: dict[str, tuple[int, ...]], path: Path) -> None:
        """Raise naming the first tensor missing or of the wrong shape, before anything loads."""
        for name, shape in self.tensors.items():
            if name not in found:
                raise ValueError(f"{FIELD}: the EAGLE-3 checkpoint {path} has no tensor {name} "
                                 f"(expected shape {list(shape)})")
        for name, shape in {**self.tensors, **self.optional}.items():
            if name in found and tuple(found[name]) != shape:
                raise ValueError(f"{FIELD}: the EAGLE-3 checkpoint's tensor {name} has shape "
                                 f"{list(found[name])}, expected {list(shape)} (from its "
                                 "config.json and the target's)")
        if EMBED not in found and self.hidden != self.target_hidden:
            raise ValueError(f"{FIELD}: the head's hidden size {self.hidden} is not the target's "
                             f"({self.target_hidden}), so it needs its own {EMBED}")

    def weight_bytes(self, dtype: torch.dtype, found: dict[str, tuple[int, ...]]) -> int:
        names = [n for n in (*self.tensors, *self.optional) if n in found and n not in (D2T, T2D)]
        size = torch.empty(0, dtype=dtype).element_size()
        return sum(size * int(torch.Size(self.shape(n)).numel()) for n in names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors.get(name) or self.optional[name]


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, read from the safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    found: dict[str, tuple[int, ...]] = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 -- safe_open is not a dict
                found[name] = tuple(f.get_slice(name).get_shape())
    return found


class _MidLayer(nn.Module):
    def __init__(self, cfg: Any, rotary: RotaryEmbedding) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, hc.rms_norm_eps(cfg)
        bias = bool(getattr(cfg, "attention_bias", False))
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.self_attn = DecoderAttention(cfg, 0, rotary, AttnOptions(qkv_bias=bias, o_bias=bias))
        # NOTE: q/k/v read the embedding and the hidden state side by side
        self.self_attn.qkv_proj = QKVParallelLinear(
            2 * h, hc.head_dim(cfg), cfg.num_attention_heads, hc.num_kv_heads(cfg), bias)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = DenseMLP(h, cfg.intermediate_size)
        self.norm_before_residual = bool(getattr(cfg, "norm_before_residual", False))


class Eagle3Head(nn.Module):
    """The head's modules under the checkpoint's names (`fc`, `midlayer`, `norm`, `lm_head`, an
    `embed_tokens` only where the checkpoint has one). Attention reads the forward context's
    batch and KV pool (layer 0), as a target's layers do."""

    def __init__(self, cfg: Any, shape: HeadShape, max_positions: int, own_embed: bool) -> None:
        super().__init__()
        h = shape.hidden
        self.fc = ReplicatedLinear(3 * shape.target_hidden, h, bool(getattr(cfg, "bias", False)))
        self.midlayer = _MidLayer(cfg, RotaryEmbedding(cfg, hc.head_dim(cfg), max_positions))
        self.norm = RMSNorm(h, hc.rms_norm_eps(cfg))
        self.lm_head = ParallelLMHead(shape.draft_vocab, h)
        self.embed_tokens = VocabParallelEmbedding(shape.target_vocab, h) if own_embed else None

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor,
                hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T], embeds [T, H] (each token's embedding), hidden [T, H] (`fc` of the
        target's auxiliary states, or the head's own output at the token before) -> (the final
        norm's output [T, H], for `lm_head`; the hidden state before it [T, H], the next
        step's `hidden`)."""
        m = self.midlayer
        normed = m.hidden_norm(hidden)
        residual = normed if m.norm_before_residual else hidden
        x = torch.cat([m.input_layernorm(embeds), normed], dim=-1)
        attn = m.self_attn
        o = attn.o_proj(attn.attend(attn.project(positions, x, residual)))
        x, residual = m.post_attention_layernorm(o, residual)
        return self.norm(m.mlp(x), residual)

    def load(self, path: Path) -> torch.Tensor | None:
        """Fill the parameters from the checkpoint (its shapes checked already); return its d2t
        (None where it has none)."""
        from safetensors import safe_open

        d2t: torch.Tensor | None = None
        weights: list[tuple[str, torch.Tensor]] = []
        for file in safetensors_files(path):
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 -- safe_open is not a dict
                    if name == D2T:
                        d2t = f.get_tensor(name).long()
                    elif name != T2D:
                        weights.append((name, f.get_tensor(name)))
        load_named_weights(self, weights, WeightNameMap())
        return d2t
