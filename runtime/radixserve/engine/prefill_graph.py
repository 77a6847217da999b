"""Prefill batches under CUDA graphs, piece by piece: one graph per stretch of the model between
two attention calls (norms, projections, rotary + KV store, MLP), per padded token count; the
attention itself runs eagerly between the replays, since its work depends on each request's
lengths, not only on the token count (vLLM's and SGLang's piecewise graphs, without a compiler:
`DecoderModel.piece` is the cut).

Why: an eager prefill step launches ~250 kernels whatever its size, ~16-40 ms of Python and
launch overhead on the H200's host. Replayed, a step costs the host one graph launch per piece
and one attention call per layer: a 300-token prefill step took 7.3 ms instead of 15.7 (the
time to first token of a short prompt on an idle server), and the offline workload's mixed
8k-token steps, which left the GPU idle half the time behind a slow host, took 20-24 ms instead
of 35-38 (docs/benchmarks.md); hence the default bound of 8,192
tokens, the default prefill chunk (`engine.DEFAULT_PREFILL_GRAPH_TOKENS`).

Every piece reads and writes static buffers (inputs, qkv, residual, attention output, final
hidden states), sized for the largest token count; a batch is padded up to the next captured
count, its padding tokens writing their KV to the pool's scratch slot. Rows never mix in these
pieces (GEMMs, per-row norms, per-token rotary), so padding rows cannot change real ones.
Graphs of every count share one memory pool, captured largest first.

With LoRA on, the pieces also read the batch's tokens grouped by adapter slot from static
buffers, filled before the first piece (every slot empty for a batch of base-model requests).

Without CUDA (`use_graphs=False`, the CPU tests) the same pieces run eagerly over the same padded
buffers: the code path a graph captures, checked against the plain forward."""
from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from radixserve.core.batch import Batch
from radixserve.core.context import forward_batch
from radixserve.engine.graph_edges import finish_capture, new_graph
from radixserve.models.decoder import AttnInputs, DecoderModel, PieceBuffers
from radixserve_kernels import LoRAGroups

if TYPE_CHECKING:
    from radixserve.attention.base import BaseAttnBackend
    from radixserve.lora.pool import LoRAPool

Piece = Callable[[], Any]  # runs (or replays) one piece; returns its AttnInputs or hidden states


def prefill_token_counts(max_tokens: int) -> list[int]:
    """Token counts captured: steps of 32 up to 512, then steps of an eighth of the count's
    power of two (64 up to 1,024, 128 up to 2,048, ...), so past 256 tokens a batch is padded by
    at most an eighth of its size."""
    counts, n = [], 32
    while n < max_tokens:
        counts.append(n)
        n += max(32, 1 << (n.bit_length() - 4))  # n // 8 rounded down to a power of two
    return counts + [max_tokens]


def _rows(a: AttnInputs, t: int) -> AttnInputs:
    return AttnInputs(a.q[:t], a.k[:t], a.v[:t], a.kv_stored, a.residual[:t], a.rope_in_attention)


class PrefillGraphRunner:
    def __init__(self, model: DecoderModel, attn_backend: BaseAttnBackend, max_tokens: int,
                 dummy_slot: int, *, use_graphs: bool = True, lora: LoRAPool | None = None) -> None:
        self.model, self.attn_backend, self.max_tokens = model, attn_backend, max_tokens
        self.lora = lora
        self.dummy_slot = dummy_slot
        self.sizes = prefill_token_counts(max_tokens)
        attn0 = model.layers[0].self_attn
        w = model.embed_tokens.weight
        dev, dtype, hidden = w.device, w.dtype, w.shape[1]
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.out_loc = torch.full((max_tokens,), dummy_slot, dtype=torch.int64, device=dev)
        self.lora_groups = None if lora is None else LoRAGroups(
            torch.full((max_tokens,), -1, dtype=torch.int32, device=dev),
            torch.zeros(max_tokens, dtype=torch.int32, device=dev),
            *torch.zeros(2, lora.num_slots, dtype=torch.int32, device=dev))
        self.bufs = PieceBuffers(
            qkv=torch.zeros(max_tokens, attn0.qkv_proj.weight.shape[0], dtype=dtype, device=dev),
            residual=torch.zeros(max_tokens, hidden, dtype=dtype, device=dev),
            hidden=torch.zeros(max_tokens, hidden, dtype=dtype, device=dev),
        )
        self.attn_out = torch.zeros(
            max_tokens, attn0.attn.num_heads * attn0.attn.head_dim, dtype=dtype, device=dev)
        self.pieces: dict[int, list[Piece]] = {}
        self._graphs: list[torch.cuda.CUDAGraph] = []  # every captured graph (for destroy)
        self._pool: Any = None
        if use_graphs:
            self._capture_all()
        else:
            self.pieces = {n: [self._eager(n, i) for i in range(model.num_pieces)]
                           for n in self.sizes}

    def can_run(self, batch: Batch) -> bool:
        return not batch.is_decode and 0 < batch.num_tokens <= self.max_tokens

    def _static_batch(self, n: int) -> Batch:
        """What a piece reads from the forward context: the static slots of n tokens (the
        request fields are placeholders: no piece reads them)."""
        one = torch.ones(1, dtype=torch.int32, device=self.input_ids.device)
        g = self.lora_groups
        lora = None if g is None else LoRAGroups(g.slots[:n], g.order[:n], g.starts, g.counts)
        return Batch("prefill", self.input_ids[:n], self.positions[:n], self.out_loc[:n],
                     one.long(), one * n, one * n, [n], [n], lora=lora)

    def _piece_fn(self, n: int, i: int) -> Callable[[], Any]:
        """Piece i over the first n rows of the static buffers: its inputs are always there."""
        ids, pos, bufs = self.input_ids[:n], self.positions[:n], PieceBuffers(
            *(b[:n] for b in self.bufs))
        o = None if i == 0 else self.attn_out[:n]
        residual = None if i == 0 else bufs.residual
        return lambda: self.model.piece(i, ids, pos, o, residual, bufs)

    def _eager(self, n: int, i: int) -> Piece:
        fn, static = self._piece_fn(n, i), self._static_batch(n)

        def run() -> Any:
            with forward_batch(static, self.attn_backend):
                return fn()
        return run

    @torch.inference_mode()
    def _capture_all(self) -> None:
        stream = torch.cuda.Stream()
        for n in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool
            fns = [self._piece_fn(n, i) for i in range(self.model.num_pieces)]
            with forward_batch(self._static_batch(n), self.attn_backend):
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):  # warm-up: kernel JIT/autotune outside capture
                    for fn in fns:
                        fn()
                stream.synchronize()
                self.pieces[n] = [self._capture(fn, stream) for fn in fns]
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def _capture(self, fn: Callable[[], Any], stream: torch.cuda.Stream) -> Piece:
        graph = new_graph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            out = fn()
        finish_capture(graph)
        self._pool = graph.pool()
        self._graphs.append(graph)

        def replay() -> Any:
            graph.replay()
            return out
        return replay

    def run(self, batch: Batch) -> torch.Tensor:
        """Hidden states [T, H] of the batch's tokens (a view of a static buffer, valid until
        the next prefill step); writes their KV. Prepares the attention backend itself."""
        t = batch.num_tokens
        n = self.sizes[bisect.bisect_left(self.sizes, t)]
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.out_loc[:t].copy_(batch.out_loc)
        if n > t:  # padding tokens keep earlier ids and positions (any are valid), and write
            self.out_loc[t:n].fill_(self.dummy_slot)  # their KV to the scratch slot
        if self.lora_groups is not None:
            self._group_lora(batch, n)
        self.attn_backend.prepare(batch)
        pieces = self.pieces[n]
        a = pieces[0]()
        for i in range(len(pieces) - 1):
            with forward_batch(batch, self.attn_backend):
                self.model.attend(i, _rows(a, t), self.attn_out[:t])
            a = pieces[i + 1]()
        return a[:t]

    def _group_lora(self, batch: Batch, n: int) -> None:
        """The batch's tokens grouped by adapter slot, into the buffers the pieces read (padding
        tokens and a batch without adapters in no group)."""
        static, t = self.lora_groups, batch.num_tokens
        static.slots[:n].fill_(-1)
        if not batch.uses_lora:
            static.counts.zero_()
            return
        g = self.lora.groups(batch)
        static.slots[:t].copy_(g.slots)
        static.order[:t].copy_(g.order)
        static.starts.copy_(g.starts)
        static.counts.copy_(g.counts)

    def destroy(self) -> None:
        for graph in self._graphs:
            graph.reset()
        self._graphs.clear()
        self.pieces.clear()
