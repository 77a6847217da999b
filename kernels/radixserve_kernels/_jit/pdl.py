from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a kernel launched with programmatic dependent launch (Hopper+): wait
    until the kernel before it has finished and its writes are visible, then let the next one
    start launching. Every such kernel waits before any load or store, so the stream order still
    holds for memory; only launch latency and prologue overlap. (Triton's `gdc_wait` and
    `gdc_launch_dependents`, written out so any Triton with `launch_pdl` runs it.)"""
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                                  dtype=tl.int32, is_pure=False, pack=1)
