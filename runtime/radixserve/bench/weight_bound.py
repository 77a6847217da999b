"""The weight-read bound of a batch-1 decode step: the step multiplies its one token by every
weight it uses, each read from memory once, so it takes at least those bytes over the memory's
bandwidth (the KV cache, activations and launches come on top). `bench latency` reports how close
batch 1 comes to it."""
from __future__ import annotations

import time

import torch
from torch import nn

from radixserve.bench.clock import device_sync
from radixserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from radixserve.layers.moe import SparseMoeBlock


def weight_bytes_per_step(model: nn.Module) -> int:
    """Bytes of this process's parameters that a batch-1 decode step reads: every parameter at
    its stored size (FP8 weights a byte, their scales included), a tied embedding once, an
    untied input embedding not at all (a step reads one row of it), and of each MoE block's
    experts the share its token is routed to (top-k of them)."""
    heads = {id(m.weight) for m in model.modules() if isinstance(m, ParallelLMHead)}
    skip = {id(m.weight) for m in model.modules()
            if isinstance(m, VocabParallelEmbedding) and id(m.weight) not in heads}
    share: dict[int, float] = {}
    for m in model.modules():
        if isinstance(m, SparseMoeBlock):
            for p in m.experts.parameters():
                share[id(p)] = m.top_k / m.experts.num_experts
    return round(sum(p.numel() * p.element_size() * share.get(id(p), 1.0)
                     for p in model.parameters() if id(p) not in skip))


def copy_bandwidth(device: torch.device, nbytes: int = 256 << 20, reps: int = 10) -> float:
    """Bytes a second that copying a buffer of `nbytes` moves on `device`, read and write both
    counted: the rate a step streaming its weights can reach (past any cache at this size). Run
    it before an engine sizes its KV cache from the free memory: the buffers are handed back."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    device_sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    device_sync(device)
    seconds = time.perf_counter() - start
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes * reps / seconds


def bound_ms(weight_bytes: int, bandwidth: float) -> float:
    return weight_bytes / bandwidth * 1000
