"""Test support: run the Triton kernels on CPU tensors through Triton's interpreter."""
from __future__ import annotations

import importlib.util
import os


def enable_cpu_interpreter() -> bool:
    """Switch Triton to its interpreter (before any kernel module is imported); returns whether
    it could. Kernel bodies are built at import, so call this before the first launch."""
    if importlib.util.find_spec("triton") is None:
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.interpreter as interp

    original = interp._patch_lang_tensor
    if getattr(original, "_radixserve_shim", False):
        return True

    # NOTE: the interpreter holds scalars as 1-element arrays and turns loop bounds into ints
    # with int(array), which NumPy >= 2.4 rejects for 1-d arrays; read the element instead.
    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._radixserve_shim = True  # type: ignore[attr-defined]
    interp._patch_lang_tensor = patched
    interp._convert_float = _fp8_rounding_convert(interp._convert_float)
    return True


def _fp8_rounding_convert(original):
    """NOTE: the interpreter narrows floats to e4m3 by cutting mantissa bits and drops the carry
    of a round-up into the exponent (7.9 becomes 4.0, not 8.0). Narrow with torch's correctly
    rounded cast instead, as the GPU does (`cvt.rn`), so FP8 kernels can be checked exactly."""
    import numpy as np
    import torch
    import triton.language as tl

    wide = {tl.float32: torch.float32, tl.float16: torch.float16, tl.bfloat16: torch.bfloat16}

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if output_dtype != tl.float8e4nv or input_dtype not in wide:
            return original(input, input_dtype, output_dtype, rounding_mode)
        src = torch.frombuffer(bytearray(np.ascontiguousarray(input).tobytes()),
                               dtype=wide[input_dtype])
        return src.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(input.shape)

    return convert
