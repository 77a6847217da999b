"""Page ids of each request's pages, concatenated (FlashInfer's `paged_kv_indices`): for request
i, `page_table[req_rows[i], 0:seq_lens[i]:P] // P`, written from `indptr[i]` on."""
from __future__ import annotations

import torch


def page_indices_ref(
    page_table: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
) -> torch.Tensor:
    parts = [page_table[r, 0:n:page_size] // page_size
             for r, n in zip(req_rows.tolist(), seq_lens.tolist())]
    return torch.cat(parts).to(torch.int32) if parts else page_table.new_zeros(0)


def page_indices(
    page_table: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
    indptr: torch.Tensor, out: torch.Tensor,
) -> torch.Tensor:
    """Triton twin of `page_indices_ref`, written into `out` (at least indptr[-1] long) given the
    device `indptr [B+1]` (exclusive cumsum of pages per request): one launch, no host sync."""
    from radixserve_kernels._jit.pages import page_indices_kernel

    bs = req_rows.shape[0]
    if bs:
        page_indices_kernel[(bs,)](
            page_table, req_rows, seq_lens, indptr, out, page_table.stride(0),
            PAGE=page_size, BLOCK=256, num_warps=4,
        )
    return out
