"""`--kv-cache-dtype`: the dtype of the KV pages, the model's own (`auto`) or a narrower one."""
from __future__ import annotations

import torch

from radixserve.config import KV_CACHE_DTYPE_CHOICES
from radixserve_kernels.kv_quant import FP8_KV_DTYPE

# each `--kv-cache-dtype` choice (declared in `config.py`) to its dtype; None: the model's
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = dict(zip(
    KV_CACHE_DTYPE_CHOICES, (None, torch.bfloat16, torch.float16, FP8_KV_DTYPE), strict=True))
FP8_MIN_CAPABILITY = (8, 9)  # e4m3 conversions in Triton need Ada or Hopper


def resolve_kv_dtype(spec: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of a `--kv-cache-dtype` value (checked by `EngineConfig`)."""
    return KV_CACHE_DTYPES[spec] or model_dtype


def check_kv_dtype_on_device(kv_dtype: torch.dtype, device: torch.device) -> None:
    """An FP8 cache on a GPU older than Ada/Hopper would fail deep inside the first kernel
    compile; say so before anything is allocated. (CPU reads FP8 through torch.)"""
    if kv_dtype != FP8_KV_DTYPE or device.type != "cuda":
        return
    cap = torch.cuda.get_device_capability(device)
    if cap < FP8_MIN_CAPABILITY:
        need = ".".join(map(str, FP8_MIN_CAPABILITY))
        raise ValueError(
            f"--kv-cache-dtype fp8_e4m3 needs a GPU of compute capability {need} or newer "
            f"(Ada, Hopper); {torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}"
        )


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The flag's spelling of a resolved KV dtype, for logs and reports."""
    if dtype == FP8_KV_DTYPE:
        return "fp8_e4m3"
    return str(dtype).removeprefix("torch.")
