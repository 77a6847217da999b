"""Reference attention over the paged KV cache in plain torch: CPU and CUDA, any page size.

Variable-length: each request costs its own length, never the batch's longest. The trailing run of
one-token requests (a decode batch, or a mixed batch's decode tail) shares one SDPA call: one query
each over its keys, padded to the longest of them (scores [rows, Hq, 1, keys]). Every other request
gets its own SDPA calls over its own keys, its queries in tiles of at most `Q_TILE`, each tile over
the keys it can see (the cached prefix and the tile's causal part), so one call's scores are at
most Hq x Q_TILE x the request's length.

NOTE: padding every request to the batch's longest query and key lengths made a mixed batch of 8
streams beside one 3.6k-token prompt cost 9x that prompt's attention, its scores included: on CPU
the streams got no token for minutes while memory doubled.

Sliding windows (`cfg.windows`): a layer with window W masks the keys more than W-1 positions
before each query; the masks are built once a batch for each distinct window. The KV pool holds
every key, so a cached prefix serves windowed and full layers alike.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from radixserve.attention.base import ATTN_BACKENDS, BaseAttnBackend
from radixserve_kernels.kv_quant import dequantize_kv_ref, gather_kv

if TYPE_CHECKING:
    from radixserve.core.batch import Batch

Q_TILE = 512  # queries of one request per SDPA call


class QueryTile(NamedTuple):
    start: int  # first row in q
    end: int
    num_keys: int  # keys the tile's queries can see: the request's first num_keys
    masks: dict[int | None, torch.Tensor | None]  # window -> [end - start, num_keys] True where
    # the query may attend the key (window None: full causal attention). A mask of None: plain
    # causal from the first key (SDPA's `is_causal`, its fused kernels)


class ExtendRequest(NamedTuple):
    kv_idx: torch.Tensor  # [seq_len] KV slot of each of the request's keys
    tiles: list[QueryTile]


class DecodeRows(NamedTuple):
    start: int  # the one-token requests are q[start:]
    kv_idx: torch.Tensor  # [rows, max_k] KV slots (past a row's length: its first slot)
    masks: dict[int | None, torch.Tensor]  # window -> [rows, 1, 1, max_k] True for a row's own
    # keys (within the window)


class TorchMetadata(NamedTuple):
    extends: list[ExtendRequest]
    decode: DecodeRows | None


def decode_tail_start(ext: list[int]) -> int:
    """Index of the first request of the batch's trailing run of one-token requests."""
    k = len(ext)
    while k > 0 and ext[k - 1] == 1:
        k -= 1
    return k


def _windowed(causal: torch.Tensor, k_pos: torch.Tensor, q_pos: torch.Tensor,
              windows: set[int | None]) -> dict[int | None, torch.Tensor]:
    """The causal mask, and for each window W that mask less the keys at or before q - W."""
    return {w: causal if w is None else causal & (k_pos > q_pos - w) for w in windows}


def _extend_request(page_table: torch.Tensor, row: torch.Tensor, seq_len: int, ext: int,
                    q_start: int, windows: set[int | None]) -> ExtendRequest:
    """`row` [1]: the request's row of the page table, on the device."""
    dev = page_table.device
    prefix = seq_len - ext
    tiles = []
    for t0 in range(0, ext, Q_TILE):
        t1 = min(t0 + Q_TILE, ext)
        n = prefix + t1  # the tile's last query sits at position n - 1
        # query i (absolute position prefix + i) sees keys 0..prefix + i
        q_pos = prefix + torch.arange(t0, t1, device=dev)[:, None]
        k_pos = torch.arange(n, device=dev)[None, :]
        masks: dict[int | None, torch.Tensor | None] = _windowed(k_pos <= q_pos, k_pos, q_pos, windows)
        if n == t1 - t0:  # no cached prefix, first tile: SDPA's own causal mask is this one
            masks[None] = None
        tiles.append(QueryTile(q_start + t0, q_start + t1, n, masks))
    kv_idx = page_table[:, :seq_len].index_select(0, row)[0].long()
    return ExtendRequest(kv_idx, tiles)


def _decode_rows(page_table: torch.Tensor, rows: torch.Tensor, seq: list[int],
                 start: int, windows: set[int | None]) -> DecodeRows:
    dev = page_table.device
    max_k = max(seq)
    seq_t = torch.tensor(seq, device=dev)[:, None]
    k_pos = torch.arange(max_k, device=dev)[None, :]
    own = k_pos < seq_t
    kv_idx = page_table[:, :max_k].index_select(0, rows).long()
    kv_idx = torch.where(own, kv_idx, kv_idx[:, :1])  # padding: a valid slot, masked out
    masks = _windowed(own, k_pos, seq_t - 1, windows)  # each row's query sits at seq - 1
    return DecodeRows(start, kv_idx, {w: m[:, None, None, :] for w, m in masks.items()})


@ATTN_BACKENDS.register("torch")
class TorchBackend(BaseAttnBackend):
    supports_sliding_window = True

    def reads_kv_dtype(self, kv_dtype: torch.dtype) -> bool:
        return True  # any dtype torch converts, FP8 through `dequantize_kv_ref`

    def prepare(self, batch: Batch) -> None:
        seq, ext = batch.seq_lens_cpu, batch.extend_lens_cpu
        pt, rows = self.cfg.page_table, batch.req_rows.to(self.cfg.device)
        split = decode_tail_start(ext)
        windows = set(self.cfg.windows) | {None}
        extends, q_start = [], 0
        for i in range(split):
            extends.append(_extend_request(pt, rows[i:i + 1], seq[i], ext[i], q_start, windows))
            q_start += ext[i]
        decode = (_decode_rows(pt, rows[split:], seq[split:], q_start, windows)
                  if split < len(ext) else None)
        batch.attn_metadata = TorchMetadata(extends, decode)

    def _kv(self, layer_id: int, kv_idx: torch.Tensor, dtype: torch.dtype
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values at `kv_idx` [..., n] as `dtype`: [..., n, Hkv, D]."""
        pool = self.cfg.kv_pool
        keys = dequantize_kv_ref(gather_kv(pool.k_cache(layer_id), kv_idx), pool.k_scale(layer_id), dtype)
        vals = dequantize_kv_ref(gather_kv(pool.v_cache(layer_id), kv_idx), pool.v_scale(layer_id), dtype)
        return keys, vals

    def attend(self, q: torch.Tensor, layer_id: int, batch: Batch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        md: TorchMetadata = batch.attn_metadata  # type: ignore[assignment]
        out = q.new_empty(q.shape) if out is None else out
        gqa = q.shape[1] != self.cfg.num_kv_heads
        window = self.cfg.window(layer_id)
        for req in md.extends:
            keys, vals = self._kv(layer_id, req.kv_idx, q.dtype)
            keys, vals = keys.transpose(0, 1), vals.transpose(0, 1)  # [Hkv, n, D]
            for t in req.tiles:
                mask = t.masks[window]
                o = F.scaled_dot_product_attention(
                    q[t.start:t.end].transpose(0, 1), keys[:, :t.num_keys], vals[:, :t.num_keys],
                    attn_mask=mask, is_causal=mask is None, scale=self.cfg.scale, enable_gqa=gqa,
                )  # [Hq, tile, D]
                out[t.start:t.end] = o.transpose(0, 1)
        if (d := md.decode) is not None:
            keys, vals = self._kv(layer_id, d.kv_idx, q.dtype)  # [rows, max_k, Hkv, D]
            o = F.scaled_dot_product_attention(
                q[d.start:, :, None], keys.transpose(1, 2), vals.transpose(1, 2),
                attn_mask=d.masks[window], scale=self.cfg.scale, enable_gqa=gqa,
            )  # [rows, Hq, 1, D]
            out[d.start:] = o[:, :, 0]
        return out
