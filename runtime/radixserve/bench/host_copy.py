"""`radixserve bench host-copy`: the host KV tier's copy rate on this machine, both ways, for a
model's KV geometry: `kv_copy`'s layer-by-layer copies of scattered device pages into runs of
host pages (what a backup and a load do), against one plain pinned-memory copy of the same bytes
(what the link gives at best). GB/s from CUDA events around each."""
from __future__ import annotations

import torch

from radixserve.kvcache.host_pool import HostKVPool
from radixserve.kvcache.kv_copy import copy_to_device, copy_to_host
from radixserve.kvcache.pool import MHAKVPool


def _time_ms(fn, repeat: int) -> float:
    fn()  # warm: allocator, kernels
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


def copy_rates(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, tokens: int,
               page_size: int, runs: int, repeat: int = 5) -> dict[str, float]:
    """GB/s of a device-to-host and a host-to-device copy of `tokens` tokens' KV, their device
    pages scattered and their host pages in `runs` runs, and of a plain pinned copy each way."""
    dev = torch.device("cuda")
    pages = -(-tokens // page_size)
    pool = MHAKVPool(layers, 2 * pages, page_size, kv_heads, head_dim, dtype, dev)
    host = HostKVPool(layers, 2 * pages, page_size, kv_heads, head_dim, dtype, pinned=True)
    gen = torch.Generator().manual_seed(0)
    dev_pages = torch.randperm(2 * pages, generator=gen)[:pages]  # scattered on the device
    # `runs` runs of host pages, a page apart
    per = -(-pages // runs)
    host_pages = torch.cat([torch.arange(i * (per + 1), i * (per + 1) + min(per, pages - i * per))
                            for i in range(runs) if i * per < pages])
    offsets = torch.arange(page_size)
    dev_slots = (dev_pages[:, None] * page_size + offsets).reshape(-1).to(dev)
    host_slots = (host_pages[:, None] * page_size + offsets).reshape(-1)
    nbytes = 2 * layers * dev_slots.numel() * kv_heads * head_dim * pool.k_cache(0).element_size()
    plain_dev = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    plain_host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    ms = {
        "tier to host": _time_ms(lambda: copy_to_host(pool, host, dev_slots, host_slots), repeat),
        "tier to device": _time_ms(lambda: copy_to_device(host, pool, host_slots, dev_slots), repeat),
        "plain to host": _time_ms(lambda: plain_host.copy_(plain_dev, non_blocking=True), repeat),
        "plain to device": _time_ms(lambda: plain_dev.copy_(plain_host, non_blocking=True), repeat),
    }
    return {"bytes": nbytes, **{k: nbytes / (v / 1e3) / 1e9 for k, v in ms.items()}}
