"""Small helpers shared by the kernel launchers."""
from __future__ import annotations

import functools
import importlib.util
import os

import torch


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def window_arg(window: int | None) -> int:
    """A sliding window as the attention kernels take it: its length in tokens, 0 for none."""
    if window is not None and window < 1:
        raise ValueError(f"a sliding window covers at least one token, got {window}")
    return window or 0


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_usable(t: torch.Tensor) -> bool:
    """Whether the Triton launchers can run on `t`: a CUDA tensor, or any tensor under the
    interpreter. Callers pick the `*_ref` twin otherwise."""
    if importlib.util.find_spec("triton") is None:
        return False
    return t.is_cuda or interpreting()


@functools.cache
def num_sms(device_index: int) -> int:
    if interpreting() or not torch.cuda.is_available():
        return 132
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sms(t: torch.Tensor) -> int:
    return num_sms((t.device.index or 0) if t.is_cuda else 0)


_pdl = {"enabled": True}


def set_pdl(enabled: bool) -> None:
    """Turn programmatic dependent launch on or off for launches from now on (the runtime passes
    RADIXSERVE_PDL here; on by default)."""
    _pdl["enabled"] = enabled


def pdl_enabled() -> bool:
    return _pdl["enabled"]


@functools.cache
def _hopper_or_later(device_index: int) -> bool:
    """sm_90 and later: programmatic dependent launch and the Tensor Memory Accelerator."""
    return not interpreting() and torch.cuda.get_device_capability(device_index)[0] >= 9


@functools.cache
def fp8_mma_capable(device_index: int) -> bool:
    """FP8 tensor-core dots (Ada, Hopper and later)."""
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


@functools.cache
def fp8_blockwise_capable(device_index: int) -> bool:
    """cuBLASLt's block-scaled FP8 GEMM (1x128 activation, 128x128 weight scales): Hopper."""
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def tma_capable(t: torch.Tensor) -> bool:
    """Whether kernels on `t` can stream tiles with the Tensor Memory Accelerator: a Hopper or
    later GPU, or any tensor under the interpreter (which emulates tensor descriptors)."""
    if interpreting():
        return True
    return t.is_cuda and _hopper_or_later(t.device.index or 0)


def pdl_args(t: torch.Tensor) -> dict[str, bool]:
    """The launch arguments of a decode-path kernel on `t`'s device: programmatic dependent
    launch (`_jit/pdl.py`) on Hopper and later, where a batch-1 decode step is ~280 small kernels
    and the launch gap between them is a large share of it. The kernel's `PDL` (its wait) and
    Triton's `launch_pdl` are one switch: a kernel launched early must wait."""
    on = _pdl["enabled"] and t.is_cuda and _hopper_or_later(t.device.index or 0)
    return {"PDL": on, "launch_pdl": on}


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 runs must match transformers' fp32 math, so no TF32 inside `tl.dot`."""
    return "ieee" if dtype == torch.float32 else "tf32"
