"""Decode under CUDA graphs: one graph per batch size in `graph_batch_sizes(max_bs)`, all sharing
one memory pool; a batch is padded up to the next captured size with fake requests that read the
padding row and write the KV pool's scratch slot."""
from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from radixserve.engine.batch import Batch
from radixserve.engine.context import forward_batch

if TYPE_CHECKING:
    from radixserve.engine.engine import Engine

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_bs] + list(range(16, max_bs, 16))
    return sorted(set(sizes + [max_bs]))


class CudaGraphRunner:
    def __init__(self, engine: Engine, max_bs: int) -> None:
        self.engine, self.max_bs = engine, max_bs
        self.sizes = graph_batch_sizes(max_bs)
        dev = engine.device
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_loc = torch.full((max_bs,), engine.kv_pool.dummy_slot, dtype=torch.int64, device=dev)
        self.req_rows = torch.full((max_bs,), engine.padding_row, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.extend_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        engine.attn_backend.init_cuda_graph(max_bs)
        self._capture_all()

    def _static_batch(self, bs: int, seq_lens_cpu: list[int]) -> Batch:
        return Batch(
            "decode", self.input_ids[:bs], self.positions[:bs], self.out_loc[:bs],
            self.req_rows[:bs], self.seq_lens[:bs], self.extend_lens[:bs], seq_lens_cpu, [1] * bs,
        )

    def _run_model(self, batch: Batch) -> torch.Tensor:
        model = self.engine.model
        with forward_batch(batch, self.engine.attn_backend):
            return model.compute_logits(model(batch.input_ids, batch.positions))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        backend, pool = self.engine.attn_backend, None
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):  # largest first: smaller graphs reuse its pool
            batch = self._static_batch(bs, [1] * bs)
            backend.prepare_for_capture(batch)
            # NOTE: the buffers were filled on the current stream; without this the warm-up may
            # read recycled memory (seen as an out-of-bounds gather in a second engine)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up: kernel JIT/autotune outside the capture
                self._run_model(batch)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = self._run_model(batch)
            pool = graph.pool()
            self.graphs[bs] = (graph, out)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, batch: Batch) -> bool:
        return batch.is_decode and batch.bs <= self.max_bs

    def run(self, batch: Batch) -> torch.Tensor:
        bs = batch.bs
        gbs = self.sizes[bisect.bisect_left(self.sizes, bs)]
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_loc[:bs].copy_(batch.out_loc)
        self.req_rows[:bs].copy_(batch.req_rows)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        if gbs > bs:  # padding requests: one token of the padding row, written to the scratch slot
            self.input_ids[bs:gbs].zero_()
            self.positions[bs:gbs].zero_()
            self.out_loc[bs:gbs].fill_(self.engine.kv_pool.dummy_slot)
            self.req_rows[bs:gbs].fill_(self.engine.padding_row)
            self.seq_lens[bs:gbs].fill_(1)
        static = self._static_batch(gbs, batch.seq_lens_cpu + [1] * (gbs - bs))
        self.engine.attn_backend.prepare_for_replay(static)
        graph, out = self.graphs[gbs]
        graph.replay()
        return out[:bs]
