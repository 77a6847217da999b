"""Vocabulary-parallel token embedding and LM head. Each rank holds a contiguous block of
ceil(vocab / tp) rows (the last block zero-padded); lookups outside the block give zeros and are
summed across ranks; logits are gathered back to the full vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.distributed import get_comm, get_tp_info
from radixserve.layers.lazy_weight import materialize
from radixserve.layers.utils import new_param


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp = get_tp_info()
        self.num_embeddings = num_embeddings
        self.rows_per_rank = -(-num_embeddings // self.tp.size)
        self.start = min(self.tp.rank * self.rows_per_rank, num_embeddings)
        self.end = min(self.start + self.rows_per_rank, num_embeddings)
        self.weight = new_param(self.rows_per_rank, embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.start) | (input_ids >= self.end)
        local = torch.where(outside, 0, input_ids - self.start)
        out = F.embedding(local, self.weight).masked_fill_(outside[:, None], 0)
        return get_comm().all_reduce(out)

    def weight_loader(
        self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None
    ) -> None:
        if full.shape[0] != self.num_embeddings or full.shape[1:] != param.shape[1:]:
            raise ValueError(
                f"embedding shape {tuple(full.shape)} does not match "
                f"({self.num_embeddings}, {param.shape[1]})"
            )
        n = self.end - self.start
        param.data[:n].copy_(materialize(full[self.start : self.end]))
        param.data[n:].zero_()


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to logits over the full vocabulary on every rank, in the model's
    dtype as transformers returns them (the sampler widens them to float32 only when it needs
    to: a greedy argmax picks the same token either way). When the embeddings are tied, the model
    points `weight` at the embedding's parameter (see `tie_to`)."""

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        assert embedding.weight.shape == self.weight.shape
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        if self.tp.size > 1:
            logits = get_comm().all_gather(logits, dim=-1)[..., : self.num_embeddings]
        return logits

    @torch.inference_mode()
    def warm_up(self, max_rows: int) -> None:
        """This rank's logits GEMM once for every row count 1..max_rows, results discarded (no
        communication). Why: cuBLAS chooses a kernel the first time a process multiplies a new
        shape, 3-4 ms of host time for the LM head on the H200, and a prefill step's logits have
        one row per request in its batch, a count that changes from step to step: the offline
        workload's first run paid it on 11 of its 18 prefill steps (docs/benchmarks.md)."""
        x = torch.zeros(max_rows, self.weight.shape[1], dtype=self.weight.dtype,
                        device=self.weight.device)
        for rows in range(1, max_rows + 1):
            F.linear(x[:rows], self.weight)
