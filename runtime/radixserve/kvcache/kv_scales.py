"""Per-layer FP8 KV scales from a checkpoint, under the names vLLM and SGLang load:

- `model.layers.N.self_attn.k_scale` / `.v_scale` (llm-compressor, compressed-tensors; also with
  vLLM's `.attn.` hop),
- `model.layers.N.self_attn.k_proj.k_scale` / `v_proj.v_scale` (NVIDIA ModelOpt),
- `model.layers.N.self_attn.k_proj.output_scale` / `v_proj.output_scale` (AMD Quark),
- `model.layers.N.self_attn.kv_scale` (deprecated: one scale for both).

A scale s means stored = value / s (`radixserve_kernels.kv_quant`). Without any, every scale is
1.0, as vLLM and SGLang use without calibration: values are stored as they are, which suits
activations well inside e4m3's range (|x| <= 448, 3 mantissa bits).
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

logger = logging.getLogger(__name__)
DEFAULT_KV_SCALE = 1.0
_SCALE_NAME = re.compile(
    r"layers\.(\d+)\.self_attn\.(?:attn\.)?"
    r"(?:(k|v)_scale|(k|v)_proj\.(?:[kv]_scale|output_scale)|(kv)_scale)$"
)
SKIP_WHEN_LOADING = (".k_scale", ".v_scale", ".kv_scale", "k_proj.output_scale",
                     "v_proj.output_scale")  # names the model's weight loader must not expect


class KVScales(NamedTuple):
    k: tuple[float, ...]  # one per layer
    v: tuple[float, ...]
    source: str  # where they came from, for the startup log

    @classmethod
    def default(cls, num_layers: int, why: str) -> KVScales:
        ones = (DEFAULT_KV_SCALE,) * num_layers
        return cls(ones, ones, f"the default {DEFAULT_KV_SCALE}, as vLLM and SGLang use without "
                               f"calibration ({why})")

    def describe(self) -> str:
        def span(xs: tuple[float, ...]) -> str:
            lo, hi = min(xs), max(xs)
            return f"{lo:.4g}" if lo == hi else f"{lo:.4g}..{hi:.4g}"
        return f"k {span(self.k)}, v {span(self.v)}: {self.source}"


def match_scale_name(name: str) -> tuple[int, str] | None:
    """(layer, "k" | "v" | "kv") for a KV-scale tensor name, else None."""
    m = _SCALE_NAME.search(name)
    if m is None:
        return None
    return int(m.group(1)), next(g for g in m.groups()[1:] if g)


def _scalar(name: str, tensor) -> float:
    if tensor.numel() != 1:
        raise ValueError(f"{name}: only per-tensor KV scales are supported (one value), got shape "
                         f"{tuple(tensor.shape)}")
    value = float(tensor.float().reshape(-1)[0])
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: a KV scale must be finite and positive, got {value}")
    return value


def checkpoint_kv_scales(model_dir: Path, num_layers: int,
                         rename: Callable[[str], str | None] | None = None) -> KVScales:
    """The checkpoint's scales (a layer missing one gets the default, with a warning); the
    default everywhere when it has none. Reads only the scale tensors. `rename`: the model's name
    of a checkpoint name, None for a tensor that is not the model's (a vision tower's)."""
    from safetensors import safe_open

    from radixserve.utils.checkpoint_files import safetensors_files

    found: dict[str, dict[int, float]] = {"k": {}, "v": {}}
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 -- safe_open is not a dict
                ours = name if rename is None else rename(name)
                hit = None if ours is None else match_scale_name(ours)
                if hit is None or hit[0] >= num_layers:
                    continue
                layer, which = hit
                value = _scalar(name, f.get_tensor(name))
                for kind in ("k", "v") if which == "kv" else (which,):
                    found[kind][layer] = value
    if not found["k"] and not found["v"]:
        return KVScales.default(num_layers, "no k_scale/v_scale in the checkpoint")
    missing = [f"{kind}{i}" for kind in ("k", "v") for i in range(num_layers) if i not in found[kind]]
    if missing:
        logger.warning("KV cache: no scale for %d of %d tensors (%s%s); they use %s",
                       len(missing), 2 * num_layers, ", ".join(missing[:6]),
                       " …" if len(missing) > 6 else "", DEFAULT_KV_SCALE)
    k = tuple(found["k"].get(i, DEFAULT_KV_SCALE) for i in range(num_layers))
    v = tuple(found["v"].get(i, DEFAULT_KV_SCALE) for i in range(num_layers))
    return KVScales(k, v, f"from the checkpoint ({model_dir.name})")
