"""Turn `--attn` into a backend: a registered name, `auto`, or `PREFILL,DECODE`."""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import shutil
from pathlib import Path

import torch

from radixserve.attention.base import ATTN_BACKENDS, AttnConfig, BaseAttnBackend
from radixserve.attention.flashinfer_limits import flashinfer_head_dim_blocker
from radixserve.attention.hybrid import HybridBackend
from radixserve.config import ATTN_CHOICES, attn_names
from radixserve_kernels.kv_quant import is_fp8

logger = logging.getLogger(__name__)

# the module that registers each backend when imported; the GPU ones import their kernels lazily
_MODULES = {name: f"radixserve.attention.{name}_backend" for name in ATTN_CHOICES}
_NEEDS = {"triton": "triton", "flashinfer": "flashinfer"}  # backend -> python package
_DEFAULT_NVCC = Path("/usr/local/cuda/bin/nvcc")  # FlashInfer's last resort, as torch's


def _spec(pkg: str):
    return importlib.util.find_spec(pkg)


def _installed(pkg: str) -> bool:
    return _spec(pkg) is not None


def available_backends(device_type: str) -> list[str]:
    """Backends usable on this device type with what is installed, fastest first."""
    if device_type != "cuda":
        return ["torch"]
    found = [n for n in ("flashinfer", "triton") if _installed(_NEEDS[n])]
    return found + ["torch"]


def flashinfer_prebuilt() -> bool:
    """FlashInfer's own test (flashinfer.jit.env, 0.5.x): its compiled modules come from the
    flashinfer-jit-cache package, else from an AOT build of flashinfer-python (`data/aot`).
    NOTE: flashinfer-cubin alone does not count: it holds TensorRT-LLM cubins, not the FA2
    prefill/decode modules our backend runs, which FlashInfer otherwise compiles with nvcc."""
    if _installed("flashinfer_jit_cache"):
        return True
    spec = _spec("flashinfer")
    roots = (spec.submodule_search_locations or []) if spec else []
    return any(any((Path(r) / "data" / "aot").glob("*/*.so")) for r in roots)


def find_nvcc() -> str | None:
    """The nvcc FlashInfer's JIT would run (flashinfer.jit.cpp_ext.get_cuda_path): CUDA_HOME (or
    CUDA_PATH) when set, and nothing else then; else nvcc on PATH; else /usr/local/cuda."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        nvcc = Path(home) / "bin" / "nvcc"
        return str(nvcc) if nvcc.is_file() else None
    return shutil.which("nvcc") or (str(_DEFAULT_NVCC) if _DEFAULT_NVCC.is_file() else None)


def flashinfer_blocker(cfg: AttnConfig | None = None) -> str | None:
    """Why FlashInfer would fail at its first kernel here (it would have to compile it and
    cannot), or None. With `cfg`, also whether FlashInfer's AOT cache holds that config's FA2
    paged-prefill module (64/128/256 head dims in 0.5.x), as FlashInfer's `JitSpec.is_aot` does,
    and whether its kernels can tile that config's heads at all."""
    if cfg is not None and (why := flashinfer_head_dim_blocker(cfg.head_dim)):
        return why
    if os.environ.get("FLASHINFER_DISABLE_JIT"):
        build = "FLASHINFER_DISABLE_JIT is set"
    elif find_nvcc() is None:
        build = "no nvcc (not on PATH, not in CUDA_HOME or /usr/local/cuda)"
    else:
        return None
    if not flashinfer_prebuilt():
        return f"FlashInfer has no prebuilt kernels (flashinfer-jit-cache) and {build} to build them"
    if cfg is not None and _prefill_module_prebuilt(cfg) is False:
        return (f"FlashInfer's prebuilt kernels lack the FA2 prefill for head_dim {cfg.head_dim}, "
                f"{cfg.dtype} over a {cfg.kv_dtype} KV cache, and {build} to build it")
    return None


def _prefill_module_prebuilt(cfg: AttnConfig) -> bool | None:
    """FlashInfer's own answer for the module `FlashInferBackend` plans (fa2, int32 indices, no
    RoPE, sliding window or soft cap); None where this FlashInfer has no such API."""
    try:
        from flashinfer.jit import env
        from flashinfer.jit.attention.modules import get_batch_prefill_uri

        uri = get_batch_prefill_uri("fa2", cfg.dtype, cfg.kv_dtype, cfg.dtype, torch.int32,
                                    cfg.head_dim, cfg.head_dim, 0, False, False, False)
        return (Path(env.FLASHINFER_AOT_DIR) / uri / f"{uri}.so").exists()
    except (ImportError, AttributeError, TypeError, KeyError, RuntimeError):
        # another FlashInfer version: trust the package-level answer
        return None


def check_backend(name: str, device_type: str) -> None:
    """ValueError unless backend `name` can run on `device_type` with what is installed; imports
    nothing (the CLI checks `--attn` with it before any process starts; `EngineConfig` has
    checked the name)."""
    if device_type != "cuda" and name != "torch":
        raise ValueError(f"attention backend {name!r} needs a CUDA device; use --attn torch on CPU")
    pkg = _NEEDS.get(name)
    if pkg and not _installed(pkg):
        raise ValueError(f"attention backend {name!r} needs the {pkg!r} package (pip install 'radixserve[gpu]')")


def _create_one(name: str, cfg: AttnConfig) -> BaseAttnBackend:
    check_backend(name, cfg.device.type)
    importlib.import_module(_MODULES[name])
    return ATTN_BACKENDS.get(name)(cfg)


def _auto(device_type: str, cfg: AttnConfig | None = None,
          kv_dtype: torch.dtype | None = None) -> tuple[str, str, str | None]:
    """(prefill, decode, why FlashInfer was passed over or None). Measured on the H200
    (docs/benchmarks.md): FlashInfer prefills fastest, Triton decodes as fast under CUDA graphs
    (and bit-identically with and without them), so both installed -> flashinfer,triton; else
    the best one installed. Over an FP8 KV cache Triton prefills faster (1.1-1.5x FlashInfer
    0.5.3's FA2 there), so Triton does both. FlashInfer is also passed over where its kernels
    would need an nvcc that is not there (a runtime image without flashinfer-jit-cache), rather
    than fail at warm-up. A model with sliding windows: Triton for both where installed (its
    kernels skip the keys outside a window), else torch; FlashInfer implements no windows."""
    found = available_backends(device_type)
    if cfg is not None and cfg.has_windows:  # Triton and torch mask windows, FlashInfer does not
        why = None
        if "flashinfer" in found:
            found.remove("flashinfer")
            why = "the model has sliding-window layers, which FlashInfer does not implement"
        return found[0], found[0], why
    kv_dtype = cfg.kv_dtype if cfg is not None else kv_dtype
    why = None
    if "flashinfer" in found:
        fp8_on_triton = kv_dtype is not None and is_fp8(kv_dtype) and "triton" in found
        why = "over an FP8 KV cache Triton's prefill is the faster" if fp8_on_triton else flashinfer_blocker(cfg)
    if why:
        found.remove("flashinfer")
    return found[0], "triton" if "triton" in found else found[0], why


def resolve_attn_spec(spec: str, device_type: str,
                      kv_dtype: torch.dtype | None = None) -> tuple[str, str]:
    """`--attn` -> (prefill, decode) names; `auto` as `_auto` decides (for a KV cache of
    `kv_dtype`, where given)."""
    if spec == "auto":
        return _auto(device_type, kv_dtype=kv_dtype)[:2]
    parts = attn_names(spec)  # (one or two names: `EngineConfig` checked the spec)
    return parts[0], parts[-1]


def create_attn_backend(spec: str, cfg: AttnConfig) -> BaseAttnBackend:
    if spec == "auto":
        prefill, decode, why = _auto(cfg.device.type, cfg)
        if why:
            logger.info("attention auto: %s prefill, not FlashInfer: %s", prefill, why)
    else:
        prefill, decode = resolve_attn_spec(spec, cfg.device.type)
    if prefill == decode:
        return _create_one(prefill, cfg)
    return HybridBackend(_create_one(prefill, cfg), _create_one(decode, cfg))
