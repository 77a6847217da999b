"""Decode under CUDA graphs: one graph per batch size in `graph_batch_sizes(max_bs)`, all sharing
one memory pool; a batch is padded up to the next captured size with fake requests that read the
padding row and write the KV pool's scratch slot. The scheduler stages a decode step's requests
straight into the graphs' buffers (`CudaGraphRunner.stage`): one host-to-device copy, then the
replay.

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

from radixserve.core.batch import Batch
from radixserve.engine.graph_edges import finish_capture, new_graph

if TYPE_CHECKING:
    from radixserve.attention.base import BaseAttnBackend

logger = logging.getLogger(__name__)

# logits [bs, vocab] of a decode batch; sets up the forward context itself
DecodeForward = Callable[[Batch], torch.Tensor]


def graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_bs] + list(range(16, max_bs, 16))
    return sorted(set(sizes + [max_bs]))


# bytes a request takes in `GraphCaptureBuffer.meta`: its row and position (int64), its length (int32)
_META_BYTES = 8 + 8 + 4


@dataclass
class GraphCaptureBuffer:
    """The static inputs every captured graph reads, sized for the largest batch. A batch padded
    to a captured size P lives in the first 20 * P bytes of `meta`: P page-table rows (int64),
    P positions (int64), P sequence lengths (int32), so the host stages a step's batch in one
    copy (`stage`). The graph itself gathers each request's token and KV slot from the token
    pool and page table (`gather`): the sampled token is already there, on the device. Rows past
    a batch's size are padding requests: the padding row's first token, written to the scratch
    slot (that row's page-table entries are all the scratch slot)."""

    meta: torch.Tensor  # [20 * max_bs] uint8
    input_ids: torch.Tensor  # [max_bs] int64, gathered in the graph
    out_loc: torch.Tensor  # [max_bs] int64, gathered in the graph
    extend_lens: torch.Tensor  # [max_bs] int32, all ones (decode)
    token_pool: torch.Tensor  # [rows, max_seq_len] the table's token ids
    page_table: torch.Tensor  # [rows, max_seq_len] int32 the table's KV slots
    padding_row: int  # a page-table row no live request holds

    @classmethod
    def create(cls, max_bs: int, token_pool: torch.Tensor, page_table: torch.Tensor,
               padding_row: int) -> GraphCaptureBuffer:
        dev = page_table.device
        meta = torch.zeros(_META_BYTES * max_bs, dtype=torch.uint8, device=dev)
        return cls(meta, torch.zeros(max_bs, dtype=torch.int64, device=dev),
                   torch.zeros(max_bs, dtype=torch.int64, device=dev),
                   torch.ones(max_bs, dtype=torch.int32, device=dev), token_pool, page_table,
                   padding_row)

    @property
    def max_bs(self) -> int:
        return int(self.input_ids.shape[0])

    def _views(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows, positions and lengths of a batch of `bs` (a captured size) in `meta`."""
        m = self.meta
        return (m[: 8 * bs].view(torch.int64), m[8 * bs : 16 * bs].view(torch.int64),
                m[16 * bs : _META_BYTES * bs].view(torch.int32))

    def batch(self, bs: int, seq_lens_cpu: list[int]) -> Batch:
        """A decode batch of `bs` over the static buffers (views: a graph captured on it reads
        them)."""
        rows, positions, seq_lens = self._views(bs)
        return Batch("decode", self.input_ids[:bs], positions, self.out_loc[:bs], rows, seq_lens,
                     self.extend_lens[:bs], seq_lens_cpu, [1] * bs)

    def gather(self, batch: Batch) -> None:
        """Each request's input token and KV slot, from its row at its position (in the graph)."""
        batch.input_ids.copy_(self.token_pool[batch.req_rows, batch.positions])
        batch.out_loc.copy_(self.page_table[batch.req_rows, batch.positions])

    def load_lists(self, rows: list[int], starts: list[int], padded_bs: int) -> Batch:
        """Stage a decode batch (request i: page-table row `rows[i]`, `starts[i]` tokens in its
        KV), padded up to `padded_bs`, with one host-to-device copy: the batch a graph of that
        size replays."""
        pad = padded_bs - len(rows)
        seq = [s + 1 for s in starts] + [1] * pad
        host = torch.empty(_META_BYTES * padded_bs, dtype=torch.uint8,
                           pin_memory=self.meta.device.type == "cuda")
        host[: 16 * padded_bs].view(torch.int64).copy_(
            torch.tensor(rows + [self.padding_row] * pad + starts + [0] * pad))
        host[16 * padded_bs :].view(torch.int32).copy_(torch.tensor(seq, dtype=torch.int32))
        self.meta[: host.shape[0]].copy_(host, non_blocking=True)
        return self.batch(padded_bs, seq)

    def load(self, batch: Batch, padded_bs: int) -> Batch:
        """Copy a decode batch built on the device in and pad it up to `padded_bs` (its tokens
        and KV slots are gathered again in the graph, from its rows and positions)."""
        bs = batch.bs
        rows, positions, seq_lens = self._views(padded_bs)
        rows[:bs].copy_(batch.req_rows)
        positions[:bs].copy_(batch.positions)
        seq_lens[:bs].copy_(batch.seq_lens)
        if padded_bs > bs:
            rows[bs:].fill_(self.padding_row)
            positions[bs:].zero_()
            seq_lens[bs:].fill_(1)
        return self.batch(padded_bs, batch.seq_lens_cpu + [1] * (padded_bs - bs))


class CudaGraphRunner:
    def __init__(self, forward: DecodeForward, attn_backend: BaseAttnBackend,
                 buffer: GraphCaptureBuffer, lora_forward: DecodeForward | None = None,
                 verify: bool = False) -> None:
        """`lora_forward` (LoRA on): the forward of a batch with adapters' requests, captured
        beside `forward` at every size, so a batch of base-model requests runs no LoRA kernel.
        `verify` (speculative decoding): verification steps replay too (`Batch.verify`); at the
        sizes where the backend fuses the new token's KV store into its attention, they get
        graphs of their own, without it."""
        self.forward, self.attn_backend, self.buffer = forward, attn_backend, buffer
        self.max_bs = buffer.max_bs
        self.sizes = graph_batch_sizes(self.max_bs)
        # the graphs by (a request of the batch has an adapter, a verification step), then size
        self.graphs: dict[tuple[bool, bool], dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]]] = {}
        self._forwards = {False: forward} if lora_forward is None else {False: forward,
                                                                        True: lora_forward}
        self._verify = verify
        self._pool: tuple[int, int] | None = None  # the graphs' one memory pool, once captured
        self._stream: torch.cuda.Stream | None = None  # the capture's
        self._staged: tuple[Batch, Batch] | None = None  # (the batch `stage` gave, padded)
        attn_backend.init_cuda_graph(self.max_bs)
        self._capture_all()

    def _own_verify_graph(self, bs: int) -> bool:
        return self._verify and self.attn_backend.fuses_rope_at(bs)

    def _variants(self, bs: int) -> list[tuple[bool, bool]]:
        """The graphs captured at size `bs`: (with adapters, a verification step's)."""
        return [(lora, verify) for lora in self._forwards for verify in (False, True)
                if not verify or self._own_verify_graph(bs)]

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self._stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):  # largest first: smaller graphs reuse its pool
            for lora, verify in self._variants(bs):
                batch = self.buffer.load_lists([], [], bs)  # all padding requests
                batch.verify = verify
                self.attn_backend.prepare_for_capture(batch)
                self.graphs.setdefault((lora, verify), {})[bs] = self._capture(
                    batch, self._forwards[lora])
        torch.cuda.current_stream().wait_stream(self._stream)
        self.attn_backend.warm_up_eager_decode(self.sizes)
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def _capture(self, batch: Batch, forward: DecodeForward) -> tuple[torch.cuda.CUDAGraph,
                                                                       torch.Tensor]:
        stream = self._stream
        # NOTE: the buffers were filled on the current stream; without this the warm-up may read
        # recycled memory (seen as an out-of-bounds gather in a second engine)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: JIT/autotune outside the capture
            self._forward(batch, forward)
        stream.synchronize()
        graph = new_graph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            out = self._forward(batch, forward)
        finish_capture(graph)
        self._pool = graph.pool()
        return graph, out

    def _forward(self, batch: Batch, forward: DecodeForward | None = None) -> torch.Tensor:
        self.buffer.gather(batch)
        return (forward or self.forward)(batch)

    def can_run(self, batch: Batch) -> bool:
        return batch.is_decode and batch.bs <= self.max_bs and (self._verify or not batch.verify)

    def can_run_verify(self, rows: int) -> bool:
        """Whether a verification step of `rows` decode rows replays a graph."""
        return self._verify and rows <= self.max_bs

    def _padded(self, bs: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, bs)]

    def stage(self, rows: list[int], starts: list[int], verify: bool = False) -> Batch | None:
        """A decode batch (request i: page-table row `rows[i]`, `starts[i]` tokens in its KV)
        written straight into the graphs' buffers, one host-to-device copy, for `run` next; None
        when no graph is large enough. Its token ids and KV slots are filled by the replay.
        (Built on the device and copied in, a step took 18 small launches before the replay.)
        `verify`: a verification step's rows (`Batch.verify`; the runner captured them)."""
        bs = len(rows)
        if bs > self.max_bs or (verify and not self._verify):
            return None
        static = self.buffer.load_lists(rows, starts, self._padded(bs))
        batch = Batch("decode", static.input_ids[:bs], static.positions[:bs], static.out_loc[:bs],
                      static.req_rows[:bs], static.seq_lens[:bs], static.extend_lens[:bs],
                      static.seq_lens_cpu[:bs], [1] * bs, verify=verify)
        static.verify = verify
        self._staged = (batch, static)
        return batch

    def run(self, batch: Batch) -> torch.Tensor:
        staged, self._staged = self._staged, None
        if staged is not None and staged[0] is batch:
            static = staged[1]
        else:  # a batch built on the device
            static = self.buffer.load(batch, self._padded(batch.bs))
            static.verify = batch.verify
        padded = static.bs
        self.attn_backend.prepare_for_replay(static)
        lora = batch.uses_lora and len(self._forwards) > 1
        verify = batch.verify and self._own_verify_graph(padded)
        graph, out = self.graphs[(lora, verify)][padded]
        graph.replay()
        return out[: batch.bs]

    def destroy(self) -> None:
        """Free the graphs now. NOTE: a graph that captured an NCCL collective holds its
        communicator until destroyed (`Engine.release_cuda_graphs`: leaving a TP group)."""
        for graphs in self.graphs.values():
            for graph, _ in graphs.values():
                graph.reset()
        self.graphs.clear()
