"""The contract every model architecture implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch
from torch import nn


class BaseCausalLM(nn.Module, ABC):
    """Built from a transformers `PretrainedConfig` (never a hand-copied one), on the meta device,
    then materialised by `load_weights`. Layers size themselves for the current TP rank."""

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [T] for the batch in the forward context. Returns hidden [T, H]
        after the final norm. Attention reads `radixserve.core.context.get_context()`."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, vocab] (model dtype) over the full vocabulary on every rank."""

    def warm_up_logits(self, max_rows: int) -> None:
        """Run `compute_logits`' GEMM once for every row count up to `max_rows` (on CUDA, before
        serving), so that no step pays cuBLAS's first choice of kernel for its shape."""

    def sliding_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window W (a query at position p sees the keys at p-W+1..p), None
        for full attention; () when every layer attends to the whole sequence. The engine hands
        them to the attention backend, which refuses them if it has no windows."""
        return ()

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Consume (HF name, full tensor) pairs; shard for this rank; raise on missing weights."""
