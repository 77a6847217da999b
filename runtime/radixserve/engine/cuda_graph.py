"""Decode under CUDA graphs: one graph per batch size in `graph_batch_sizes(max_bs)`, all sharing
one memory pool; a batch is padded up to the next captured size with fake requests that read the
padding row and write the KV pool's scratch slot.

The runner gets what it uses explicitly (the forward function, the attention backend, its
buffers) and never sees the engine: the engine holds the runner, not the other way round, so
dropping an engine frees its graphs without waiting for the garbage collector."""
from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.engine.batch import Batch
from radixserve.engine.graph_edges import finish_capture, new_graph

if TYPE_CHECKING:
    from radixserve.attention.base import BaseAttnBackend

logger = logging.getLogger(__name__)

# logits [bs, vocab] of a decode batch; sets up the forward context itself
DecodeForward = Callable[[Batch], torch.Tensor]


def graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_bs] + list(range(16, max_bs, 16))
    return sorted(set(sizes + [max_bs]))


@dataclass
class GraphCaptureBuffer:
    """The static inputs every captured graph reads, sized for the largest batch. Rows past a
    batch's size are padding requests: the padding row's one token, written to the scratch slot."""

    input_ids: torch.Tensor  # [max_bs] int64
    positions: torch.Tensor  # [max_bs] int64
    out_loc: torch.Tensor  # [max_bs] int64
    req_rows: torch.Tensor  # [max_bs] int64
    seq_lens: torch.Tensor  # [max_bs] int32
    extend_lens: torch.Tensor  # [max_bs] int32, all ones (decode)
    dummy_slot: int  # the KV pool's scratch slot
    padding_row: int  # a page-table row no live request holds

    @classmethod
    def create(cls, max_bs: int, device: torch.device, dummy_slot: int,
               padding_row: int) -> GraphCaptureBuffer:
        def full(value: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((max_bs,), value, dtype=dtype, device=device)

        return cls(full(0, torch.int64), full(0, torch.int64), full(dummy_slot, torch.int64),
                   full(padding_row, torch.int64), full(1, torch.int32), full(1, torch.int32),
                   dummy_slot, padding_row)

    @property
    def max_bs(self) -> int:
        return int(self.input_ids.shape[0])

    def batch(self, bs: int, seq_lens_cpu: list[int]) -> Batch:
        """The first `bs` rows as a decode batch (views: a graph captured on it reads them)."""
        return Batch("decode", self.input_ids[:bs], self.positions[:bs], self.out_loc[:bs],
                     self.req_rows[:bs], self.seq_lens[:bs], self.extend_lens[:bs], seq_lens_cpu,
                     [1] * bs)

    def load(self, batch: Batch, padded_bs: int) -> Batch:
        """Copy `batch` in and pad it up to `padded_bs`: the batch a graph of that size replays."""
        bs = batch.bs
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_loc[:bs].copy_(batch.out_loc)
        self.req_rows[:bs].copy_(batch.req_rows)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        if padded_bs > bs:
            self.input_ids[bs:padded_bs].zero_()
            self.positions[bs:padded_bs].zero_()
            self.out_loc[bs:padded_bs].fill_(self.dummy_slot)
            self.req_rows[bs:padded_bs].fill_(self.padding_row)
            self.seq_lens[bs:padded_bs].fill_(1)
        return self.batch(padded_bs, batch.seq_lens_cpu + [1] * (padded_bs - bs))


class CudaGraphRunner:
    def __init__(self, forward: DecodeForward, attn_backend: BaseAttnBackend,
                 buffer: GraphCaptureBuffer) -> None:
        self.forward, self.attn_backend, self.buffer = forward, attn_backend, buffer
        self.max_bs = buffer.max_bs
        self.sizes = graph_batch_sizes(self.max_bs)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        attn_backend.init_cuda_graph(self.max_bs)
        self._capture_all()

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):  # largest first: smaller graphs reuse its pool
            batch = self.buffer.batch(bs, [1] * bs)
            self.attn_backend.prepare_for_capture(batch)
            # NOTE: the buffers were filled on the current stream; without this the warm-up may
            # read recycled memory (seen as an out-of-bounds gather in a second engine)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up: kernel JIT/autotune outside the capture
                self.forward(batch)
            stream.synchronize()
            graph = new_graph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = self.forward(batch)
            finish_capture(graph)
            pool = graph.pool()
            self.graphs[bs] = (graph, out)
        torch.cuda.current_stream().wait_stream(stream)
        self.attn_backend.warm_up_eager_decode(self.sizes)
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, batch: Batch) -> bool:
        return batch.is_decode and batch.bs <= self.max_bs

    def run(self, batch: Batch) -> torch.Tensor:
        padded = self.sizes[bisect.bisect_left(self.sizes, batch.bs)]
        static = self.buffer.load(batch, padded)
        self.attn_backend.prepare_for_replay(static)
        graph, out = self.graphs[padded]
        graph.replay()
        return out[: batch.bs]

    def destroy(self) -> None:
        """Free the graphs now. NOTE: a graph that captured an NCCL collective holds its
        communicator until destroyed (`scheduler/tp.py`: leaving a TP group)."""
        for graph, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()
