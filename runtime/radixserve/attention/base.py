"""The attention backend contract shared by torch, triton and flashinfer implementations."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.utils.registry import Registry

if TYPE_CHECKING:
    from radixserve.core.batch import Batch
    from radixserve.kvcache.pool import MHAKVPool
    from radixserve_kernels import NewTokenKV


@dataclass(frozen=True)
class AttnConfig:
    num_qo_heads: int  # heads on this TP rank
    num_kv_heads: int  # KV heads on this TP rank
    head_dim: int
    page_size: int
    kv_pool: MHAKVPool
    page_table: torch.Tensor  # [max_running_reqs, max_seq_len] int32 KV slot of each token
    device: torch.device
    dtype: torch.dtype
    # Each layer's sliding window W (a query at position p attends to the keys at p-W+1..p), None
    # for full attention; () when no layer has one. NOTE: the KV pool keeps every token's k/v in
    # every layer, windowed or not, and a backend masks the keys a window leaves out; so a cached
    # prefix (radix cache) holds all a later request needs, for full and windowed layers alike.
    windows: tuple[int | None, ...] = ()

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5

    def window(self, layer_id: int) -> int | None:
        return self.windows[layer_id] if self.windows else None

    @property
    def has_windows(self) -> bool:
        return any(w is not None for w in self.windows)

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.kv_pool.dtype


class BaseAttnBackend(ABC):
    supports_sliding_window = False  # whether `attend` masks keys outside `cfg.windows`

    def __init__(self, cfg: AttnConfig) -> None:
        self.cfg = cfg
        if cfg.has_windows and not self.supports_sliding_window:
            windows = sorted({w for w in cfg.windows if w is not None})
            raise ValueError(
                f"attention backend {type(self).__name__} does not implement sliding-window "
                f"attention, which this model's layers use (windows of {windows} tokens); "
                "use --attn triton (GPU) or torch"
            )
        if not self.reads_kv_dtype(cfg.kv_dtype):
            raise ValueError(
                f"attention backend {type(self).__name__} cannot read a {cfg.kv_dtype} KV cache "
                f"with a {cfg.dtype} model; choose another --attn or --kv-cache-dtype"
            )

    def reads_kv_dtype(self, kv_dtype: torch.dtype) -> bool:
        """Whether `attend` reads a KV pool of this dtype correctly (an FP8 one with its scales).
        The model's own dtype always; a backend that reads more says so, so that no backend
        ever reads bytes it does not understand."""
        return kv_dtype == self.cfg.dtype

    @abstractmethod
    def prepare(self, batch: Batch) -> None:
        """Build `batch.attn_metadata` once per batch, before the model's forward."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer_id: int,
        batch: Batch, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] for the batch's new tokens. Stores k/v into the KV pool at
        `batch.out_loc`, then returns `attend`'s output. k and v None: the pool already holds them
        there (on CUDA the rotary kernel stores them in the same launch). `out`: a contiguous
        [T, Hq, D] buffer the output goes to (and is returned)."""
        if k is not None:
            assert v is not None, "k and v come together"
            self.cfg.kv_pool.store_kv(k, v, batch.out_loc, layer_id)
        return self.attend(q, layer_id, batch, out)

    @abstractmethod
    def attend(self, q: torch.Tensor, layer_id: int, batch: Batch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention output [T, Hq, D] of q [T, Hq, D] over each request's whole KV in the
        pool (cached prefix + the new tokens, already stored at `batch.out_loc`); written to
        `out` when given."""

    def fuses_rope(self, batch: Batch) -> bool:
        """Whether `attend_new_token` can take this batch's new token as the qkv projection left
        it and do the rotary kernel's work (norms, rotation, KV store) in its own launch."""
        return False

    def fuses_rope_at(self, bs: int) -> bool:
        """Whether a decode batch of `bs` rows (not a verification step's) is one `fuses_rope`
        takes: a CUDA graph captured at that size runs the fused launch."""
        return False

    def attend_new_token(self, q: torch.Tensor, new: NewTokenKV, layer_id: int, batch: Batch,
                         out: torch.Tensor | None = None) -> torch.Tensor:
        """`attend` for a batch where `fuses_rope`: q [T, Hq, D] not yet rotated, and the new
        token's k/v in `new`, stored by the same launch."""
        raise NotImplementedError(f"{type(self).__name__} does not rotate the new token itself")

    @property
    def supports_cuda_graph(self) -> bool:
        return type(self).init_cuda_graph is not BaseAttnBackend.init_cuda_graph

    # CUDA-graph hooks: backends that support decode graphs override these.
    def init_cuda_graph(self, max_bs: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_for_capture(self, batch: Batch) -> None:
        raise NotImplementedError

    def prepare_for_replay(self, batch: Batch) -> None:
        """`batch` holds the captured batch's device tensors, refilled in place (a backend may
        keep reading them in the graph), with this step's host-side lists."""
        raise NotImplementedError

    def warm_up_eager_decode(self, batch_sizes: list[int]) -> None:
        """Compile, with the graphs and before serving, the decode kernels that only eager
        batches launch (a mixed batch's decode tail); nothing by default."""


ATTN_BACKENDS: Registry[type[BaseAttnBackend]] = Registry("attention backend")
