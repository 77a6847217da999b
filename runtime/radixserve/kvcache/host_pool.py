"""The host tier's KV pool (HiCache): the device pool's layout, `[2, layers, slots, kv_heads,
head_dim]` of the same dtype (FP8 pages stay FP8), in pinned memory on a CUDA machine so its
copies are asynchronous DMA, and in plain memory on CPU, where it is a second pool beside the
device one (same memory: no speed claim, every code path exercised). One per TP rank, of that
rank's heads."""
from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from radixserve.kvcache.sizing import available_bytes
from radixserve.utils.tensor import lazy_zeros

logger = logging.getLogger(__name__)


class HostTierSize(NamedTuple):
    """How large the host tier is: `size_gib` per rank when given, else `ratio` times the
    device pool's tokens."""

    ratio: float
    size_gib: float | None


class HostKVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, pinned: bool) -> None:
        if num_pages < 1:
            raise ValueError(f"the host tier needs at least one page, got {num_pages}")
        self.num_pages, self.page_size = num_pages, page_size
        shape = (2, num_layers, num_pages * page_size, num_kv_heads, head_dim)
        # NOTE: never read before a copy writes it, so pinned memory need not be zeroed (zeroing
        # tens of GiB would hold up start-up); on CPU the zero pages cost nothing until written
        self._kv = (torch.empty(shape, dtype=dtype, pin_memory=True) if pinned
                    else lazy_zeros(shape, dtype, "cpu"))

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv[0, layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv[1, layer_id]

    @property
    def num_layers(self) -> int:
        return self._kv.shape[1]


def host_tier_tokens(size: HostTierSize, device_tokens: int, bytes_per_token: int) -> int:
    """Host-tier tokens: `size_gib` of this rank's KV, else `ratio` times the device pool."""
    if size.size_gib is not None:
        return int(size.size_gib * 2**30) // bytes_per_token
    return int(size.ratio * device_tokens)


def check_host_memory(host_bytes: int, device: torch.device) -> None:
    """A host tier (`host_bytes`: every TP rank's on this machine) larger than the memory left
    would be killed mid-serving: refuse it now. On CPU the device pool is in the same memory and
    was sized with the tier in mind."""
    left = available_bytes()
    if left is not None and host_bytes > left:
        raise RuntimeError(
            f"the host KV tier needs {host_bytes / 2**30:.2f} GiB but only {left / 2**30:.2f} GiB "
            f"of host memory is left ({device}): lower --hicache-ratio or --hicache-size, or raise "
            "the container's memory limit")
    logger.info("host KV tier: %.2f GiB (%s memory)", host_bytes / 2**30,
                "pinned" if device.type == "cuda" else "the same")
