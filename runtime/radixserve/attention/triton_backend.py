"""Attention with our own Triton kernels (`radixserve_kernels`): flash-decoding for decode
batches, a paged causal kernel for prefill/extend; decode can be captured in CUDA graphs.
Sliding windows (`cfg.windows`): each layer's window goes to both kernels, which read only the
key blocks a window can see; it is a per-layer constant, so a decode graph captures it as it
captures the scale."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.attention.base import ATTN_BACKENDS, AttnConfig, BaseAttnBackend
from radixserve.attention.mixed import MixedParts, attend_parts, split_decode_tail
from radixserve.utils.tensor import to_device

if TYPE_CHECKING:
    from radixserve.core.batch import Batch
    from radixserve_kernels import NewTokenKV


class TritonMetadata(NamedTuple):
    req_rows: torch.Tensor  # [bs] page-table row of each request
    seq_lens: torch.Tensor  # [bs] int32
    extend_lens: torch.Tensor | None  # [bs] int32; None for decode
    qo_start: torch.Tensor | None  # [bs] int32 first row of each request's tokens in q
    max_extend: int
    num_splits: int  # decode only
    order: torch.Tensor | None = None  # decode only: launch order, longest request first
    rotates_new_token: bool = False  # decode only: the kernel does the rotary work (`fuses_rope`)


@ATTN_BACKENDS.register("triton")
class TritonBackend(BaseAttnBackend):
    # Decode batches up to this size rotate and store the new token in the decode kernel, one
    # launch a layer fewer. On the H200 (Qwen3-0.6B shapes, 800-token contexts, ms a step) it
    # saves 0.03-0.04 at 1-32 requests, nothing at 64, and costs 0.05-0.08 at 128-256, where
    # each of the many programs pays for its new-token work (docs/benchmarks.md).
    ROPE_IN_DECODE_MAX_BS = 32
    supports_sliding_window = True

    def __init__(self, cfg: AttnConfig) -> None:
        super().__init__(cfg)
        from radixserve_kernels._utils import device_sms

        self._sms = device_sms(cfg.page_table)
        self._graph_order: torch.Tensor | None = None

    def reads_kv_dtype(self, kv_dtype: torch.dtype) -> bool:
        return True  # the kernels widen K/V to q's dtype and apply an FP8 cache's scales

    def fuses_rope_at(self, bs: int) -> bool:
        from radixserve_kernels import decode_rope_fusable

        return bs <= self.ROPE_IN_DECODE_MAX_BS and decode_rope_fusable(self.cfg.head_dim)

    def _decode_metadata(self, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                         seq_lens_cpu: list[int], order_buf: torch.Tensor | None = None,
                         verify: bool = False) -> TritonMetadata:
        """With `order_buf` (graphs), the launch order goes into it: the buffer a replay reads.
        `verify`: a verification step's rows, which never fuse the new token's store (a program
        would read keys another program of the launch still has to store)."""
        from radixserve_kernels import decode_num_splits, decode_order_cpu

        bs = req_rows.shape[0]
        splits = decode_num_splits(bs, self.cfg.num_kv_heads, self._sms)
        # one sort a step for all layers, on the host, which holds the lengths
        order = decode_order_cpu(seq_lens_cpu)
        if order is not None:
            order = to_device(order, req_rows.device, out=order_buf)
        rotates = not verify and self.fuses_rope_at(bs)
        return TritonMetadata(req_rows, seq_lens, None, None, 1, splits, order, rotates)

    def prepare(self, batch: Batch) -> None:
        if (parts := split_decode_tail(batch)) is not None:  # a mixed batch: `attention/mixed.py`
            self.prepare(parts.prefill)
            self.prepare(parts.decode)
            batch.attn_metadata = parts
            return
        if batch.is_decode:
            batch.attn_metadata = self._decode_metadata(batch.req_rows, batch.seq_lens,
                                                        batch.seq_lens_cpu, verify=batch.verify)
            return
        ext = batch.extend_lens
        qo_start = torch.cumsum(ext, 0, dtype=torch.int32) - ext
        batch.attn_metadata = TritonMetadata(
            batch.req_rows, batch.seq_lens, ext, qo_start, max(batch.extend_lens_cpu), 0
        )

    def attend(self, q: torch.Tensor, layer_id: int, batch: Batch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        from radixserve_kernels import extend_attention

        if isinstance(batch.attn_metadata, MixedParts):
            return attend_parts(self, self, q, layer_id, batch.attn_metadata, out)
        md: TritonMetadata = batch.attn_metadata  # type: ignore[assignment]
        if md.extend_lens is None:
            return self._decode(q, layer_id, md, out)
        pool, cfg = self.cfg.kv_pool, self.cfg
        return extend_attention(
            q, pool.k_cache(layer_id), pool.v_cache(layer_id), cfg.page_table, md.req_rows,
            md.seq_lens, md.extend_lens, cfg.scale, md.qo_start, md.max_extend, out=out,
            k_scale=pool.k_scale(layer_id), v_scale=pool.v_scale(layer_id),
            window=cfg.window(layer_id),
        )

    def fuses_rope(self, batch: Batch) -> bool:
        """Decode batches of up to ROPE_IN_DECODE_MAX_BS requests, decided once in `prepare`."""
        md = batch.attn_metadata
        return isinstance(md, TritonMetadata) and md.rotates_new_token

    def attend_new_token(self, q: torch.Tensor, new: NewTokenKV, layer_id: int, batch: Batch,
                         out: torch.Tensor | None = None) -> torch.Tensor:
        assert self.fuses_rope(batch), "a small decode batch of the Triton backend only"
        return self._decode(q, layer_id, batch.attn_metadata, out, new)  # type: ignore[arg-type]

    def _decode(self, q: torch.Tensor, layer_id: int, md: TritonMetadata,
                out: torch.Tensor | None, new: NewTokenKV | None = None) -> torch.Tensor:
        from radixserve_kernels import decode_attention

        pool, cfg = self.cfg.kv_pool, self.cfg
        return decode_attention(
            q, pool.k_cache(layer_id), pool.v_cache(layer_id), cfg.page_table, md.req_rows,
            md.seq_lens, cfg.scale, num_splits=md.num_splits, out=out, order=md.order,
            k_scale=pool.k_scale(layer_id), v_scale=pool.v_scale(layer_id), new_kv=new,
            window=cfg.window(layer_id),
        )

    # CUDA graphs: the captured kernels read request rows and lengths from the runner's static
    # buffers, the batch handed in (padded to a captured size), which every replay refills in
    # place; the launch order has a static buffer here.
    def init_cuda_graph(self, max_bs: int) -> None:
        self._graph_order = torch.arange(max_bs, dtype=torch.int64, device=self.cfg.device)

    def _fill_static(self, batch: Batch) -> None:
        assert batch.is_decode, "CUDA graphs capture decode batches only"
        assert self._graph_order is not None, "init_cuda_graph first"
        batch.attn_metadata = self._decode_metadata(batch.req_rows, batch.seq_lens,
                                                    batch.seq_lens_cpu, self._graph_order,
                                                    batch.verify)

    def prepare_for_capture(self, batch: Batch) -> None:
        self._fill_static(batch)

    def warm_up_eager_decode(self, batch_sizes: list[int]) -> None:
        """A mixed batch's decode tail runs eagerly and unrotated (the prefill part's rotary
        kernel did that work), and without a launch order under ORDER_MIN_BS requests; the
        graphs capture the rotating kernel up to ROPE_IN_DECODE_MAX_BS requests and the ordered
        one from ORDER_MIN_BS. Without this, a first tail of another kind compiled (0.7 s on the
        H200) or loaded its kernel in the middle of serving (docs/benchmarks.md). One size per
        split count and block shape (both follow the batch's next power of two)."""
        from radixserve_kernels._utils import next_pow2
        from radixserve_kernels.decode_attention import ORDER_MIN_BS

        cfg = self.cfg
        top = min(max(batch_sizes), ORDER_MIN_BS - 1)
        for bs in sorted({min(next_pow2(b), top) for b in range(1, top + 1)}):
            rows = torch.zeros(bs, dtype=torch.int64, device=cfg.device)
            lens = torch.ones(bs, dtype=torch.int32, device=cfg.device)
            q = torch.zeros(bs, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.dtype, device=cfg.device)
            self._decode(q, 0, self._decode_metadata(rows, lens, [1] * bs), None)

    def prepare_for_replay(self, batch: Batch) -> None:
        self._fill_static(batch)
