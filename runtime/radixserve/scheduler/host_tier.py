"""The host tier's copies (HiCache), carried out for the prefix cache's decisions
(`kvcache/hiradix.py`): on a GPU, loads on a load stream and backups on a write stream, ordered
against the compute stream by events, so the host never waits for a copy; on CPU, at once.
Every decision (what to copy, which pages) is the tree's, taken on the host from state every TP
rank shares, so ranks agree without a message; only the copies' timing is the GPU's.

The ordering on a GPU, each rule closing a hazard:
- a backup reads KV a forward may still be computing, through slot indices the compute stream
  wrote (a node's `indices`, converted from its page-table slots when it was inserted): it waits
  for the compute stream as of the forward just launched (`after_launch`), or, when an eviction
  needs it now, as of now (a node inserted since the last launch, by a request that finished,
  has indices enqueued after that launch: waiting for the launch alone read them unwritten, an
  out-of-bounds gather on an H100);
- a backup writes host pages that host eviction freed, which a load may still be reading: it
  waits for the last load;
- a load writes device pages whose slots came from allocator ops on the compute stream and which
  the batch in flight may still write (a prompt's duplicate pages are freed while it computes
  them): it waits for the compute stream at the launch of the batch that reads it, and for the
  backups of the host pages it reads (each node's `host_ready`);
- the forward that reads loaded pages waits for them layer by layer (`LayerEvents`), so its first
  layers run while the later ones are still copied;
- the device pages of a node evicted while its backup may still read them are reused only after
  that backup: the compute stream waits for it before the next forward (and loads wait for the
  compute stream).
"""
from __future__ import annotations

import torch

from radixserve.kvcache.hiradix import CopyOrder
from radixserve.kvcache.host_pool import HostKVPool
from radixserve.kvcache.kv_copy import KVLayers, copy_to_device, copy_to_host


class LayerEvents:
    """One event per layer, recorded once that layer of a load is copied: the forward of the
    batch that reads the loaded pages waits for each before its attention reads that layer."""

    def __init__(self, events: list[torch.cuda.Event]) -> None:
        self.events = events

    def wait(self, layer_id: int) -> None:
        torch.cuda.current_stream().wait_event(self.events[layer_id])


class HostTier:
    def __init__(self, device_pool: KVLayers, host_pool: HostKVPool,
                 device: torch.device) -> None:
        self.device_pool, self.host_pool = device_pool, host_pool
        cuda = device.type == "cuda"
        self._load_stream = torch.cuda.Stream(device) if cuda else None
        self._write_stream = torch.cuda.Stream(device) if cuda else None
        self._last_compute: torch.cuda.Event | None = None  # after the last forward's launch
        self._last_load: torch.cuda.Event | None = None
        self._fences: list[torch.cuda.Event] = []  # backups still reading freed device pages
        self.loaded_tokens = 0  # host-to-device
        self.written_tokens = 0  # device-to-host

    def evicted(self, writes: list[CopyOrder], ready: list[object]) -> None:
        """An eviction freed device pages: back up now what it decided to keep (`writes`: the
        pages are reused from now on), and make the next forward wait for those backups and for
        the earlier ones (`ready`: the evicted nodes' `host_ready`) that may still read them."""
        now = None
        if self._write_stream is not None and writes:
            now = torch.cuda.Event()
            now.record()
        event = self._write(writes, now)
        if self._write_stream is not None:
            self._fences += [e for e in ready if e is not None]
            if event is not None:
                self._fences.append(event)

    def before_launch(self, loads: list[CopyOrder]) -> LayerEvents | None:
        """Before a forward: its wait for reused device pages, and the loads of the pages it
        reads, started now; the events its attention layers wait for (None: nothing to wait)."""
        stream = self._load_stream
        if stream is None:
            if loads:
                copy_to_device(self.host_pool, self.device_pool, _cat(loads, 1), _cat(loads, 0))
                self.loaded_tokens += sum(len(o.device) for o in loads)
            return None
        compute = torch.cuda.current_stream()
        for fence in self._fences:
            compute.wait_event(fence)
        self._fences.clear()
        if not loads:
            return None
        stream.wait_stream(compute)
        events: list[torch.cuda.Event] = []

        def recorded(_layer: int) -> None:
            events.append(torch.cuda.Event())
            events[-1].record(stream)

        with torch.cuda.stream(stream):
            for o in loads:
                if o.node.host_ready is not None:
                    stream.wait_event(o.node.host_ready)
                o.device.record_stream(stream)
            copy_to_device(self.host_pool, self.device_pool, _cat(loads, 1), _cat(loads, 0),
                           recorded)
        self._last_load = events[-1]
        self.loaded_tokens += sum(len(o.device) for o in loads)
        return LayerEvents(events)

    def after_launch(self, writes: list[CopyOrder]) -> None:
        """After a forward's launch: the backups decided so far, behind it."""
        if self._write_stream is not None:
            self._last_compute = torch.cuda.Event()
            self._last_compute.record()
        self._write(writes, self._last_compute)

    def _write(self, writes: list[CopyOrder], after: torch.cuda.Event | None) -> torch.cuda.Event | None:
        if not writes:
            return None
        self.written_tokens += sum(len(o.device) for o in writes)
        stream = self._write_stream
        if stream is None:
            copy_to_host(self.device_pool, self.host_pool, _cat(writes, 0), _cat(writes, 1))
            return None
        with torch.cuda.stream(stream):
            if after is not None:
                stream.wait_event(after)
            if self._last_load is not None:
                stream.wait_event(self._last_load)
            for o in writes:
                o.device.record_stream(stream)
            copy_to_host(self.device_pool, self.host_pool, _cat(writes, 0), _cat(writes, 1))
            event = torch.cuda.Event()
            event.record(stream)
        for o in writes:
            o.node.host_ready = event
        return event


def _cat(orders: list[CopyOrder], field: int) -> torch.Tensor:
    """The device (0) or host (1) slots of `orders`, in order."""
    return torch.cat([o[field] for o in orders])
