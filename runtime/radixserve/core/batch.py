"""The unit of work the scheduler hands to the engine: one forward pass over many requests."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import torch

if TYPE_CHECKING:
    from radixserve_kernels import LoRAGroups


class KVReady(Protocol):
    """What a forward waits for before a layer's attention reads KV still being copied in (the
    host KV tier's loads, `scheduler/host_tier.py`)."""

    def wait(self, layer_id: int) -> None: ...


@dataclass
class Batch:
    """Tokens of `bs` requests, flattened request after request.

    Request i contributes `extend_lens[i]` new tokens whose KV is written at `out_loc`; its KV after
    this pass spans `seq_lens[i]` tokens, held in page-table row `req_rows[i]` at columns
    `0 .. seq_lens[i]-1` (the first `seq_lens[i] - extend_lens[i]` are cached already).
    Device tensors live on the engine's device; the `_cpu` lists mirror them for host-side logic.
    """

    phase: Literal["prefill", "decode"]
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    out_loc: torch.Tensor  # [num_tokens] int64, KV slot of each new token
    req_rows: torch.Tensor  # [bs] int64, page-table row of each request
    seq_lens: torch.Tensor  # [bs] int32
    extend_lens: torch.Tensor  # [bs] int32
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    attn_metadata: object | None = None  # built by the attention backend's prepare()
    # whether a request of the batch runs with a LoRA adapter (set by the scheduler), and its
    # tokens grouped by adapter slot (set by the engine, `lora/pool.py`)
    uses_lora: bool = False
    lora: LoRAGroups | None = None
    kv_ready: KVReady | None = None  # pages this batch reads that are still being loaded
    # a verification step run as decode rows (`scheduler/verify_step.py`): a request's row per
    # token it verifies, each reading the KV its earlier rows store in the same step, so every
    # row's KV is stored before any is read (no kernel fuses the store into its attention)
    verify: bool = False

    @property
    def bs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"
