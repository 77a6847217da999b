"""Embedding requests (`SamplingParams.embed`, `/v1/embeddings`): the hidden state after the
final norm at the prompt's last token (the pooling of Qwen3-Embedding and most decoder-based
embedders), L2-normalized, taken from the prefill batch that computes that token."""
from __future__ import annotations

from typing import NamedTuple

import torch

from radixserve.core.request import Req
from radixserve.utils.tensor import pinned_copy


class Embeddings(NamedTuple):
    reqs: list[Req]
    vectors: torch.Tensor  # [len(reqs), hidden] float32, unit length


def plan(items: list[tuple[Req, int]]) -> tuple[list[Req], list[int]]:
    """Of the prefill `items` (before their `kv_len` advances): the embedding requests whose
    prompt ends in this batch, and the batch position of that last token."""
    reqs, rows, offset = [], [], 0
    for req, n in items:
        if req.params.embed and req.kv_len + n == req.prompt_len:
            reqs.append(req)
            rows.append(offset + n - 1)
        offset += n
    return reqs, rows


def compute(reqs: list[Req], hidden: torch.Tensor) -> Embeddings:
    return Embeddings(reqs, torch.nn.functional.normalize(hidden.float(), dim=-1))


def to_host(e: Embeddings) -> Embeddings:
    """Started now, complete once the batch's host copy event has fired (`inflight.py`)."""
    return e._replace(vectors=pinned_copy(e.vectors))
