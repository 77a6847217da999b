"""The paged KV pool: per-layer K and V buffers indexed by slot (page * page_size + offset)."""
from __future__ import annotations

import torch

from radixserve.utils import kernel_path
from radixserve_kernels import store_kv, store_kv_ref


class MHAKVPool:
    """K and V for MHA/GQA models, `[num_slots + page_size, num_kv_heads, head_dim]` per layer.

    `num_kv_heads` is the count on this TP rank. The page past the last allocatable one is a
    scratch page never handed out: padded (fake) tokens of a CUDA-graph replay write to
    `dummy_slot` there, so they can never clobber a live request's KV.
    """

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self._num_pages = num_pages
        self._page_size = page_size
        rows = (num_pages + 1) * page_size
        # NOTE: zeros, not empty: kernels may read unwritten rows of a partial page, and 0 * NaN
        # from uninitialised memory would leak NaNs into masked-out positions.
        self._kv = torch.zeros(
            (2, num_layers, rows, num_kv_heads, head_dim), dtype=dtype, device=device
        )

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv[0, layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv[1, layer_id]

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Write k/v `[T, Hkv, D]` to rows `out_loc` `[T]` of layer `layer_id` (no host sync)."""
        fn = store_kv if kernel_path.use_triton(k) else store_kv_ref
        fn(self._kv[0, layer_id], self._kv[1, layer_id], k, v, out_loc)

    @property
    def num_layers(self) -> int:
        return self._kv.shape[1]

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def num_slots(self) -> int:
        return self._num_pages * self._page_size

    @property
    def dummy_slot(self) -> int:
        return self.num_slots

    @property
    def dtype(self) -> torch.dtype:
        return self._kv.dtype

    @property
    def device(self) -> torch.device:
        return self._kv.device
