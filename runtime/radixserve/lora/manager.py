"""Which adapters are served and which fill the device's slots: one per rank's scheduler, every
rank deciding alike from the same messages.

Served adapters live in host memory; a request of one takes a slot at admission (`acquire`):
the slot already holding its adapter, else a free one, else the least recently used slot no
running request holds, which is refilled from host memory. It holds it, pinned, until it ends
(`release`); while every slot is pinned by other adapters' requests it waits in the queue.

Every load of an adapter gets a namespace of its own (a number never reused), the prefix cache's
key beside the tokens: a request reuses KV only of requests of the same adapter as loaded then,
never the base model's or another adapter's, nor that of an adapter of the same name unloaded
and loaded again. Unloading an adapter takes its name off at once (new requests are refused);
requests already queued or running hold the adapter itself and finish with it."""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

from radixserve.lora.adapter import LoRAAdapter
from radixserve.lora.pool import LoRAPool

BASE_NAMESPACE = 0  # the base model's requests


@dataclass
class _Slot:
    adapter: LoRAAdapter
    namespace: int
    pins: int = 0  # running requests holding it


class LoRAManager:
    def __init__(self, pool: LoRAPool) -> None:
        self.pool = pool
        self.served: dict[str, tuple[LoRAAdapter, int]] = {}  # name -> (adapter, namespace)
        self._namespaces = itertools.count(BASE_NAMESPACE + 1)
        # slot -> what fills it, least recently used first
        self._slots: OrderedDict[int, _Slot] = OrderedDict()

    def add(self, adapter: LoRAAdapter) -> None:
        """Serve `adapter` under its name (not already served: the caller checks)."""
        assert adapter.name not in self.served, f"{adapter.name} is served already"
        self.served[adapter.name] = (adapter, next(self._namespaces))

    def remove(self, name: str) -> None:
        """Stop serving `name`; a slot that holds it and no request is freed."""
        _, ns = self.served.pop(name)
        for slot, held in list(self._slots.items()):
            if held.namespace == ns and held.pins == 0:
                del self._slots[slot]

    def acquire(self, adapter: LoRAAdapter, ns: int) -> int | None:
        """A slot holding `adapter` (loaded as namespace `ns`), pinned for one request; None if
        every slot is pinned by requests of other adapters."""
        for slot, held in self._slots.items():
            if held.namespace == ns:
                held.pins += 1
                self._slots.move_to_end(slot)
                return slot
        free = [s for s in range(self.pool.num_slots) if s not in self._slots]
        if free:
            slot = free[0]
        else:
            idle = [s for s, held in self._slots.items() if held.pins == 0]  # LRU first
            if not idle:
                return None
            slot = idle[0]
            del self._slots[slot]
        self.pool.fill(slot, adapter)
        self._slots[slot] = _Slot(adapter, ns, pins=1)
        return slot

    def release(self, slot: int) -> None:
        """A request of the adapter in `slot` ended; a slot of an adapter no longer served is
        freed once no request holds it."""
        held = self._slots[slot]
        assert held.pins > 0, f"slot {slot} released more often than acquired"
        held.pins -= 1
        if held.pins == 0 and self.served.get(held.adapter.name, (None, -1))[1] != held.namespace:
            del self._slots[slot]

