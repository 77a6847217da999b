"""Greedy decoding's pick: each row's first column holding its largest value, as
`torch.argmax(x, -1)` (a NaN counted as +inf). On the H200 torch's reduction read
256 x 151,936 bf16 logits in 54 µs (1.44 TB/s), a decode step's sampling; split into chunks
across the GPU and merged per row, the same read takes 28 µs (docs/benchmarks.md)."""
from __future__ import annotations

import torch

from radixserve_kernels._utils import cdiv, next_pow2

ARGMAX_CHUNK = 4096  # columns a program reads: Qwen's 151,936 make 38 chunks a row


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    return x.argmax(-1)


def argmax_rows(x: torch.Tensor, chunk: int = ARGMAX_CHUNK) -> torch.Tensor:
    """Triton twin of `argmax_rows_ref` for x [rows, cols] (rows may be strided, last dim
    contiguous): int64 [rows]. Two launches, no host sync."""
    from radixserve_kernels._jit.argmax import argmax_chunk_kernel, argmax_merge_kernel

    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax_rows takes [rows, cols > 0], got {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if not rows:
        return out
    n_chunks = cdiv(cols, chunk)
    vals = torch.empty(rows, n_chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, n_chunks, dtype=torch.int32, device=x.device)
    argmax_chunk_kernel[(rows, n_chunks)](x, vals, idx, cols, x.stride(0), n_chunks, BLOCK=chunk,
                                          num_warps=4)
    argmax_merge_kernel[(rows,)](vals, idx, out, n_chunks, BLOCK=max(16, next_pow2(n_chunks)),
                                 num_warps=1)
    return out
