"""Tensor-parallel-aware building blocks of the models. Every layer sizes its parameters for the
current TP rank and owns a `weight_loader(param, full_tensor, shard_id=None)` that copies this
rank's shard of a full Hugging Face tensor."""

from __future__ import annotations

from radixserve.layers.activation import SiluAndMul
from radixserve.layers.attention import AttentionLayer
from radixserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from radixserve.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from radixserve.layers.moe import MOE_BACKENDS, FusedMoE, SparseMoeBlock
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding

__all__ = [
    "MOE_BACKENDS",
    "AttentionLayer",
    "ColumnParallelLinear",
    "FusedMoE",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RMSNorm",
    "ReplicatedLinear",
    "RotaryEmbedding",
    "RowParallelLinear",
    "SiluAndMul",
    "SparseMoeBlock",
    "VocabParallelEmbedding",
]
