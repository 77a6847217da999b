"""Turn `--attn` into a backend: a registered name, `auto`, or `PREFILL,DECODE`."""
from __future__ import annotations

import importlib
import importlib.util

from radixserve.attention.base import ATTN_BACKENDS, AttnConfig, BaseAttnBackend
from radixserve.attention.hybrid import HybridBackend

# modules that register a backend when imported; the GPU ones import their kernels lazily
_MODULES = {
    "torch": "radixserve.attention.torch_backend",
    "triton": "radixserve.attention.triton_backend",
    "flashinfer": "radixserve.attention.flashinfer_backend",
}
_NEEDS = {"triton": "triton", "flashinfer": "flashinfer"}  # backend -> python package


def available_backends(device_type: str) -> list[str]:
    """Backends usable on this device type with what is installed, fastest first."""
    if device_type != "cuda":
        return ["torch"]
    found = [n for n in ("flashinfer", "triton") if importlib.util.find_spec(_NEEDS[n])]
    return found + ["torch"]


def check_backend(name: str, device_type: str) -> None:
    """ValueError unless backend `name` can run on `device_type` with what is installed; imports
    nothing (the CLI checks `--attn` with it before any process starts)."""
    if name not in _MODULES:
        raise ValueError(f"unknown attention backend {name!r}; choose one of: auto, {', '.join(_MODULES)}")
    if device_type != "cuda" and name != "torch":
        raise ValueError(f"attention backend {name!r} needs a CUDA device; use --attn torch on CPU")
    pkg = _NEEDS.get(name)
    if pkg and importlib.util.find_spec(pkg) is None:
        raise ValueError(f"attention backend {name!r} needs the {pkg!r} package (pip install 'radixserve[gpu]')")


def _create_one(name: str, cfg: AttnConfig) -> BaseAttnBackend:
    check_backend(name, cfg.device.type)
    importlib.import_module(_MODULES[name])
    return ATTN_BACKENDS.get(name)(cfg)


def resolve_attn_spec(spec: str, device_type: str) -> tuple[str, str]:
    """`auto` -> (prefill, decode) names. Measured on the H200 (docs/benchmarks.md): FlashInfer
    prefills fastest, Triton decodes as fast under CUDA graphs (and bit-identically with and
    without them), so both installed -> flashinfer,triton; else the best one installed."""
    if spec == "auto":
        found = available_backends(device_type)
        decode = "triton" if "triton" in found else found[0]
        return found[0], decode
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) == 1:
        return parts[0], parts[0]
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    raise ValueError(f"--attn must be NAME or PREFILL,DECODE, got {spec!r}")


def create_attn_backend(spec: str, cfg: AttnConfig) -> BaseAttnBackend:
    prefill, decode = resolve_attn_spec(spec, cfg.device.type)
    if prefill == decode:
        return _create_one(prefill, cfg)
    return HybridBackend(_create_one(prefill, cfg), _create_one(decode, cfg))
