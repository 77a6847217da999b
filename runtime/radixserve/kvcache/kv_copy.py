"""Copies of KV between the device pool and the host tier's pool, layer by layer, in large
contiguous pieces: the host tier gives a node's pages consecutive slots where it can
(`PageAllocator` hands out and takes back runs), so each run of consecutive host slots is one
copy per layer and K/V, and the device side is gathered into (or scattered from) a contiguous
staging buffer by one index kernel per layer and K/V. Both pools keep `[slots, kv_heads,
head_dim]` per layer. Copies are enqueued on the current stream and never wait for the host;
the caller picks the stream (`scheduler/host_tier.py`). On CPU the same code runs synchronously.

FP8 pages move as raw bytes: index kernels are not defined for every float8 dtype."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class KVLayers(Protocol):
    """What a KV pool offers a copy: per-layer K and V `[slots, kv_heads, head_dim]`."""

    @property
    def num_layers(self) -> int: ...

    def k_cache(self, layer_id: int) -> torch.Tensor: ...

    def v_cache(self, layer_id: int) -> torch.Tensor: ...


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.view(_RAW[t.element_size()])


def host_runs(slots: torch.Tensor) -> list[tuple[int, int, int]]:
    """(first slot, position in `slots`, length) of each run of consecutive slots."""
    if slots.numel() == 0:
        return []
    s = slots.to("cpu", torch.int64)
    starts = torch.cat([torch.tensor([0]), (s[1:] != s[:-1] + 1).nonzero().flatten() + 1])
    ends = torch.cat([starts[1:], torch.tensor([s.numel()])])
    return [(int(s[a]), int(a), int(b - a)) for a, b in zip(starts.tolist(), ends.tolist())]


def _pairs(src: KVLayers, dst: KVLayers, layer: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    return ((src.k_cache(layer), dst.k_cache(layer)), (src.v_cache(layer), dst.v_cache(layer)))


def copy_to_host(device: KVLayers, host: KVLayers, device_slots: torch.Tensor,
                 host_slots: torch.Tensor) -> None:
    """KV at `device_slots` (on the device pool's device) into `host_slots` (CPU), every layer."""
    runs = host_runs(host_slots)
    for layer in range(device.num_layers):
        for src, dst in _pairs(device, host, layer):
            staged = _raw(src).index_select(0, device_slots)
            out = _raw(dst)
            for first, pos, n in runs:
                out[first : first + n].copy_(staged[pos : pos + n], non_blocking=True)


def copy_to_device(host: KVLayers, device: KVLayers, host_slots: torch.Tensor,
                   device_slots: torch.Tensor,
                   after_layer: Callable[[int], None] | None = None) -> None:
    """KV at `host_slots` into `device_slots`, layer by layer; `after_layer(i)` once layer i is
    enqueued (the caller records an event there, for a forward that waits layer by layer)."""
    runs = host_runs(host_slots)
    k0 = _raw(device.k_cache(0))
    stage = torch.empty((device_slots.numel(), *k0.shape[1:]), dtype=k0.dtype, device=k0.device)
    for layer in range(device.num_layers):
        for src, dst in _pairs(host, device, layer):
            raw = _raw(src)
            for first, pos, n in runs:
                stage[pos : pos + n].copy_(raw[first : first + n], non_blocking=True)
            _raw(dst).index_copy_(0, device_slots, stage)
        if after_layer is not None:
            after_layer(layer)
