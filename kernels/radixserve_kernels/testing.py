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
    return True
