"""Which twin a layer runs: the Triton kernel of `radixserve_kernels` or its torch `*_ref`.

Layers call `kernel_path.use_triton(x)` through the module (not a from-import) so a test can
switch the kernels on for CPU tensors under Triton's interpreter.
"""
from __future__ import annotations

import functools
import importlib.util

import torch


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor) -> bool:
    """CUDA tensors, when triton is installed. Decided from the device alone, never from values,
    so a CUDA graph captures whichever path this picks.

    NOTE: not `radixserve_kernels.triton_usable`, which also says yes to CPU tensors whenever
    TRITON_INTERPRET=1 is set; the kernel tests set it process-wide, and the CPU model path
    must stay the torch one there."""
    return t.is_cuda and _triton_installed()
