"""Rotary position embedding, rotate-half (neox) style as in transformers' Llama and Qwen. The
inverse frequencies come from transformers' own `ROPE_INIT_FUNCTIONS`, so `llama3`, `linear`,
`yarn`… match the library; cos/sin are cached for every position up to the maximum (built by the
kernel package's helper, the layout its Triton kernel reads on CUDA)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixserve.layers.norm import RMSNorm
from radixserve.utils import kernel_path
from radixserve_kernels import (
    RopeParams,
    apply_rotary_ref,
    build_cos_sin_cache,
    qk_norm_rope_,
    store_kv_ref,
)

if TYPE_CHECKING:
    from radixserve.layers.attention import KVDestination

# These change frequencies with the running sequence length; a fixed cache cannot express them.
_DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The RoPE settings as one dict with `rope_type` and `rope_theta`: transformers 5 keeps them in
    `config.rope_parameters` (one dict per `layer_type` for models whose layer kinds differ, as
    Gemma 3); older versions in `rope_theta` and `rope_scaling` (Gemma 3's local layers: in
    `rope_local_base_freq`, unscaled)."""
    params = getattr(hf_config, "rope_parameters", None)
    if params and layer_type is not None and layer_type in params:
        params = dict(params[layer_type])
    elif params:
        params = dict(params)
    elif layer_type == "sliding_attention":
        params = {"rope_theta": getattr(hf_config, "rope_local_base_freq", 10000.0)}
    else:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def compute_inv_freq(hf_config: Any, head_dim: int,
                     layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] float32, attention scaling applied to cos/sin) of the layers of
    `layer_type` (where the config's RoPE differs by layer kind)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = rope_parameters(hf_config, layer_type)
    nested = layer_type is not None and layer_type in (getattr(hf_config, "rope_parameters", None) or {})
    rope_type = params["rope_type"]
    if rope_type in _DYNAMIC_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported (frequencies depend on the sequence length)"
        )
    init_fn = ROPE_INIT_FUNCTIONS.get(rope_type)
    if init_fn is not None:
        kw = {"layer_type": layer_type} if nested else {}
        inv_freq, scaling = init_fn(hf_config, torch.device("cpu"), **kw)
    elif rope_type == "default":  # transformers 5 computes the default inside each model
        base = float(params["rope_theta"])
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaling = 1.0
    else:
        raise ValueError(
            f"unknown rope_type {rope_type!r}; transformers knows: "
            f"default, {', '.join(sorted(ROPE_INIT_FUNCTIONS))}"
        )
    if inv_freq.numel() * 2 != head_dim:
        raise ValueError(
            f"partial rotary embeddings (rotary dim {inv_freq.numel() * 2} < head_dim "
            f"{head_dim}) are not supported"
        )
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(nn.Module):
    def __init__(self, hf_config: Any, head_dim: int, max_positions: int,
                 layer_type: str | None = None) -> None:
        super().__init__()
        self.hf_config, self.head_dim, self.max_positions = hf_config, head_dim, max_positions
        self.layer_type = layer_type
        # [position, cos | sin] in float32, the layout the Triton kernel reads
        self.register_buffer(
            "cos_sin_cache",
            torch.empty(max_positions, head_dim, dtype=torch.float32),
            persistent=False,
        )
        if self.cos_sin_cache.device.type != "meta":
            self.on_materialized()

    def on_materialized(self) -> None:
        """Fill the cache; the loader calls this after `to_empty`, which leaves buffers garbage."""
        inv_freq, scaling = compute_inv_freq(self.hf_config, self.head_dim, self.layer_type)
        self.cos_sin_cache.copy_(build_cos_sin_cache(inv_freq, self.max_positions, scaling))

    def decode_rope(self, q_norm: RMSNorm | None = None,
                    k_norm: RMSNorm | None = None) -> RopeParams:
        """What `forward` would apply, for a decode kernel that applies it itself."""
        return RopeParams(self.cos_sin_cache, None if q_norm is None else q_norm.weight,
                          None if k_norm is None else k_norm.weight,
                          q_norm.eps if q_norm is not None else 0.0)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None,
        v: torch.Tensor | None = None, kv_dest: KVDestination | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; q [T, Hq*D], k/v [T, Hk*D] (last dim contiguous) -> rotated q, k. With
        `q_norm`/`k_norm` (Qwen3's per-head RMSNorms) each head is normalised first. With
        `kv_dest`, the rotated k and `v` are also stored there. On CUDA one Triton kernel does it
        all, q and k in place (four launches fewer per layer)."""
        (t, qw), kw, d = q.shape, k.shape[1], self.head_dim
        q3, k3 = q.view(t, qw // d, d), k.view(t, kw // d, d)
        assert kv_dest is None or v is not None, "storing k/v needs v"
        v3 = None if v is None else v.view(t, kw // d, d)
        if kernel_path.use_triton(q):
            eps = q_norm.eps if q_norm is not None else 0.0
            store = {} if kv_dest is None else {"v": v3, **kv_dest._asdict()}
            qk_norm_rope_(q3, k3, positions, self.cos_sin_cache,
                          None if q_norm is None else q_norm.weight,
                          None if k_norm is None else k_norm.weight, eps, **store)
            return q, k
        if q_norm is not None and k_norm is not None:
            q3, k3 = q_norm(q3), k_norm(k3)
        q3, k3 = apply_rotary_ref(q3, k3, positions, self.cos_sin_cache)
        if kv_dest is not None:
            store_kv_ref(kv_dest.k_cache, kv_dest.v_cache, k3, v3, kv_dest.out_loc,
                         kv_dest.k_scale, kv_dest.v_scale)
        return q3.reshape(t, qw), k3.reshape(t, kw)
