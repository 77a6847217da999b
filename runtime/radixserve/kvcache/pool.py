"""The paged KV pool: per-layer K and V buffers indexed by slot (page * page_size + offset)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.utils import kernel_path
from radixserve.utils.tensor import lazy_zeros
from radixserve_kernels import store_kv, store_kv_ref
from radixserve_kernels.kv_quant import is_fp8


class MHAKVPool:
    """K and V for MHA/GQA models, `[num_slots + page_size, num_kv_heads, head_dim]` per layer.

    `num_kv_heads` is the count on this TP rank. The page past the last allocatable one is a
    scratch page never handed out: padded (fake) tokens of a CUDA-graph replay write to
    `dummy_slot` there, so they can never clobber a live request's KV.

    An FP8 (`float8_e4m3fn`) pool keeps one K and one V scale per layer (`kv_quant`); every
    writer and reader of its rows uses them. Other dtypes have scales of 1.0.
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
        k_scales: Sequence[float] | None = None,
        v_scales: Sequence[float] | None = None,
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
        self._kv = lazy_zeros((2, num_layers, rows, num_kv_heads, head_dim), dtype, device)
        self._k_scales = self._check_scales("k_scales", k_scales, num_layers, dtype)
        self._v_scales = self._check_scales("v_scales", v_scales, num_layers, dtype)

    @staticmethod
    def _check_scales(
        name: str, scales: Sequence[float] | None, num_layers: int, dtype: torch.dtype
    ) -> tuple[float, ...]:
        if scales is None:
            return (1.0,) * num_layers
        out = tuple(float(s) for s in scales)
        if len(out) != num_layers:
            raise ValueError(f"{name}: {len(out)} given for {num_layers} layers")
        if not is_fp8(dtype) and any(s != 1.0 for s in out):
            raise ValueError(f"{name}: scales apply to an FP8 KV pool only, not {dtype}")
        if any(not s > 0 for s in out):
            raise ValueError(f"{name}: scales must be positive")
        return out

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv[0, layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv[1, layer_id]

    def k_scale(self, layer_id: int) -> float:
        return self._k_scales[layer_id]

    def v_scale(self, layer_id: int) -> float:
        return self._v_scales[layer_id]

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Write k/v `[T, Hkv, D]` to rows `out_loc` `[T]` of layer `layer_id` (no host sync)."""
        fn = store_kv if kernel_path.use_triton(k) else store_kv_ref
        fn(self._kv[0, layer_id], self._kv[1, layer_id], k, v, out_loc,
           self._k_scales[layer_id], self._v_scales[layer_id])

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
    def is_fp8(self) -> bool:
        return is_fp8(self._kv.dtype)

    @property
    def device(self) -> torch.device:
        return self._kv.device
