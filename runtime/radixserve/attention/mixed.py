"""A mixed batch (prompt chunks first, then one token of each running request: the scheduler's
mixed chunk) attended in two launches: the prompt tokens by the prefill kernel, the one-token
requests by the decode kernel. In one prefill launch each of those tokens costs a whole query
tile (64-128 rows) over its request's whole KV: on the H200, beside an 8k-token chunk, ~240
decode tokens took longer than the chunk's own attention (docs/benchmarks.md)."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.core.batch import Batch

if TYPE_CHECKING:
    from radixserve.attention.base import BaseAttnBackend


class MixedParts(NamedTuple):
    """`batch.attn_metadata` of a split batch: its two parts (each with its own metadata) and
    the first row of the decode part."""

    prefill: Batch
    decode: Batch
    split: int


def split_decode_tail(batch: Batch) -> MixedParts | None:
    """The batch's trailing one-token requests as a decode batch, the rest as a prefill batch;
    None unless both are non-empty. (A prompt's last one-token chunk may land in the decode part:
    one query over its request's KV is what the decode kernel computes.)"""
    if batch.is_decode:
        return None
    ext = batch.extend_lens_cpu
    k = len(ext)
    while k > 0 and ext[k - 1] == 1:
        k -= 1
    if k == 0 or k == len(ext):
        return None
    s = sum(ext[:k])

    def part(phase, rows: slice, reqs: slice) -> Batch:
        # NOTE: the per-request tensors are copied, not sliced: Triton specializes a kernel on
        # each pointer's 16-byte alignment, so a slice starting at request k would compile the
        # decode kernel anew for each k mod 4 in the middle of serving (seconds each, on the H200)
        return Batch(phase, batch.input_ids[rows], batch.positions[rows], batch.out_loc[rows],
                     batch.req_rows[reqs].clone(), batch.seq_lens[reqs].clone(),
                     batch.extend_lens[reqs].clone(), batch.seq_lens_cpu[reqs], ext[reqs])

    return MixedParts(part("prefill", slice(None, s), slice(None, k)),
                      part("decode", slice(s, None), slice(k, None)), s)


def attend_parts(prefill: BaseAttnBackend, decode: BaseAttnBackend, q: torch.Tensor,
                 layer_id: int, parts: MixedParts, out: torch.Tensor | None) -> torch.Tensor:
    """q [T, Hq, D] of a split batch -> its attention output, each part by its backend."""
    out = q.new_empty(q.shape) if out is None else out
    s = parts.split
    prefill.attend(q[:s], layer_id, parts.prefill, out[:s])
    decode.attend(q[s:], layer_id, parts.decode, out[s:])
    return out
