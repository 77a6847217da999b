"""The LM head's warm-up: its logits GEMM once for every row count a step can give it (cuBLAS
chooses a kernel the first time a process sees a shape; the engine pays that before serving)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from radixserve.layers import embedding
from radixserve.layers.embedding import ParallelLMHead


def test_warm_up_multiplies_every_row_count_by_the_heads_own_weight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    head = ParallelLMHead(num_embeddings=40, embedding_dim=8)
    head.weight.data = torch.randn(40, 8)
    before = head.weight.detach().clone()
    seen: list[tuple[int, int]] = []

    def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        assert weight is head.weight, "warmed a different weight than the one the head multiplies"
        seen.append(tuple(x.shape))
        return F.linear(x, weight)

    monkeypatch.setattr(embedding, "F", SimpleNamespace(linear=linear))
    head.warm_up(max_rows=12)
    assert seen == [(rows, 8) for rows in range(1, 13)]
    assert torch.equal(head.weight, before)
