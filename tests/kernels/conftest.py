"""The interpreter tier: on a machine without CUDA, the Triton kernels run on CPU tensors through
Triton's interpreter, switched on here before any kernel body is built."""
from __future__ import annotations

import torch

from radixserve_kernels.testing import enable_cpu_interpreter

if not torch.cuda.is_available():
    enable_cpu_interpreter()
