"""One backend for prefill, another for decode (e.g. `--attn flashinfer,triton`), over one KV pool:
the inherited `forward` stores k/v, the picked backend attends."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixserve.attention.base import BaseAttnBackend
from radixserve.attention.mixed import MixedParts, attend_parts, split_decode_tail

if TYPE_CHECKING:
    from radixserve.core.batch import Batch
    from radixserve_kernels import NewTokenKV


class HybridBackend(BaseAttnBackend):
    def __init__(self, prefill: BaseAttnBackend, decode: BaseAttnBackend) -> None:
        self.prefill, self.decode = prefill, decode  # (before the base's check reads them)
        super().__init__(prefill.cfg)

    @property
    def supports_sliding_window(self) -> bool:  # type: ignore[override]
        """A windowed model's layers run on both parts (a mixed batch's tail on the decode one)."""
        return self.prefill.supports_sliding_window and self.decode.supports_sliding_window

    def reads_kv_dtype(self, kv_dtype: torch.dtype) -> bool:
        return True  # each part checked its own when it was built

    def _pick(self, batch: Batch) -> BaseAttnBackend:
        return self.decode if batch.is_decode else self.prefill

    def prepare(self, batch: Batch) -> None:
        """A mixed batch's one-token requests go to the decode backend (`attention/mixed.py`)."""
        if (parts := split_decode_tail(batch)) is None:
            return self._pick(batch).prepare(batch)
        self.prefill.prepare(parts.prefill)
        self.decode.prepare(parts.decode)
        batch.attn_metadata = parts

    def attend(self, q: torch.Tensor, layer_id: int, batch: Batch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(batch.attn_metadata, MixedParts):
            return attend_parts(self.prefill, self.decode, q, layer_id, batch.attn_metadata, out)
        return self._pick(batch).attend(q, layer_id, batch, out)

    def fuses_rope(self, batch: Batch) -> bool:
        return self._pick(batch).fuses_rope(batch)  # a mixed batch's metadata says no

    def fuses_rope_at(self, bs: int) -> bool:
        return self.decode.fuses_rope_at(bs)

    def attend_new_token(self, q: torch.Tensor, new: NewTokenKV, layer_id: int, batch: Batch,
                         out: torch.Tensor | None = None) -> torch.Tensor:
        return self._pick(batch).attend_new_token(q, new, layer_id, batch, out)

    # CUDA graphs only ever capture decode batches
    @property
    def supports_cuda_graph(self) -> bool:
        return self.decode.supports_cuda_graph

    def init_cuda_graph(self, max_bs: int) -> None:
        self.decode.init_cuda_graph(max_bs)

    def prepare_for_capture(self, batch: Batch) -> None:
        self.decode.prepare_for_capture(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        self.decode.prepare_for_replay(batch)

    def warm_up_eager_decode(self, batch_sizes: list[int]) -> None:
        self.decode.warm_up_eager_decode(batch_sizes)
