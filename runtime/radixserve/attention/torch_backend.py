"""Reference attention over the paged KV cache in plain torch: CPU and CUDA, any page size.

Requests are padded to the longest one in the batch so each layer is one batched SDPA call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from radixserve.attention.base import ATTN_BACKENDS, BaseAttnBackend
from radixserve_kernels.kv_quant import dequantize_kv_ref, gather_kv

if TYPE_CHECKING:
    from radixserve.engine.batch import Batch


class TorchMetadata(NamedTuple):
    kv_idx: torch.Tensor  # [bs, Lk] KV slot of each key (padding: any valid slot)
    mask: torch.Tensor  # [bs, 1, Lq, Lk] True where query may attend key
    tok_req: torch.Tensor  # [T] request of each new token
    tok_pos: torch.Tensor  # [T] index of each new token within its request's queries
    max_q: int


@ATTN_BACKENDS.register("torch")
class TorchBackend(BaseAttnBackend):
    def reads_kv_dtype(self, kv_dtype: torch.dtype) -> bool:
        return True  # any dtype torch converts, FP8 through `dequantize_kv_ref`

    def prepare(self, batch: Batch) -> None:
        dev = self.cfg.device
        seq, ext = batch.seq_lens_cpu, batch.extend_lens_cpu
        max_k, max_q = max(seq), max(ext)
        rows = batch.req_rows.to(dev)
        kv_idx = self.cfg.page_table[rows, :max_k].long()
        seq_t = torch.tensor(seq, device=dev)
        prefix_t = seq_t - torch.tensor(ext, device=dev)
        k_pos = torch.arange(max_k, device=dev)
        q_pos = torch.arange(max_q, device=dev)
        # query i of a request sits at absolute position prefix + i and sees keys 0..prefix+i
        mask = k_pos[None, None, :] <= (prefix_t[:, None, None] + q_pos[None, :, None])
        mask &= k_pos[None, None, :] < seq_t[:, None, None]
        mask[:, :, 0] = True  # padding queries attend to something: no NaN rows
        kv_idx = torch.where(k_pos[None, :] < seq_t[:, None], kv_idx, kv_idx[:, :1])
        ext_t = torch.tensor(ext, device=dev)
        tok_req = torch.repeat_interleave(torch.arange(len(ext), device=dev), ext_t)
        starts = torch.cumsum(ext_t, 0) - ext_t
        tok_pos = torch.arange(int(ext_t.sum()), device=dev) - starts[tok_req]
        batch.attn_metadata = TorchMetadata(kv_idx, mask[:, None], tok_req, tok_pos, max_q)

    def attend(self, q: torch.Tensor, layer_id: int, batch: Batch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        md: TorchMetadata = batch.attn_metadata  # type: ignore[assignment]
        pool = self.cfg.kv_pool
        k_cache, v_cache = pool.k_cache(layer_id), pool.v_cache(layer_id)
        keys = dequantize_kv_ref(gather_kv(k_cache, md.kv_idx), pool.k_scale(layer_id), q.dtype)
        vals = dequantize_kv_ref(gather_kv(v_cache, md.kv_idx), pool.v_scale(layer_id), q.dtype)
        keys, vals = keys.transpose(1, 2), vals.transpose(1, 2)  # [bs, Hkv, Lk, D]
        bs, hq, d = len(batch.seq_lens_cpu), q.shape[1], q.shape[2]
        q_pad = q.new_zeros(bs, md.max_q, hq, d)
        q_pad[md.tok_req, md.tok_pos] = q
        o = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2), keys, vals,
            attn_mask=md.mask, scale=self.cfg.scale, enable_gqa=hq != keys.shape[1],
        )  # [bs, Hq, Lq, D]
        o = o.transpose(1, 2)[md.tok_req, md.tok_pos]
        return o if out is None else out.copy_(o)
