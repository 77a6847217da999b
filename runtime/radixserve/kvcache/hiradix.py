"""The radix cache with a host-memory tier (HiCache): a node's KV lives on the device, in the host
tier, or in both. Eviction from the device keeps a node whose KV the host tier holds (it becomes
host-only); a match that reaches host-only nodes reports them (`MatchResult.host_len`) and
`load_back` gives them device slots again. The tree decides; the copies it asks for are listed
in `writes` (device to host) and `loads` (host to device) for the host tier to carry out
(`scheduler/host_tier.py`): this module moves no data.

Invariants, on top of `radix.py`'s (`check_integrity` checks them all):
- every node is on the device, in the host tier, or both; `host` has the key's length;
- the device part is prefix-closed: a node on the device has its parent on the device, so a match
  is some device nodes, then some host-only ones; so is the host part: a node the host holds has
  its parent held too, so a host-only node's children are host-only and a device leaf that the
  host does not hold has no children at all (eviction may drop it as the plain cache does);
- `evictable`, `protected` and the eviction candidates count the device's tokens only; a
  candidate is an unreferenced node on the device none of whose children is;
- the host tier's pages are exactly its free list plus the tree's `host` slots, each once;
- host eviction takes only unreferenced nodes none of whose children the host holds (least
  recently used first), never the ancestors of a node being backed up: a referenced node may be
  loading, and a backup must keep its parent's host copy.

Write policies: `write_through` backs a node up as soon as it is inserted; `write_back` only when
the device evicts it. Either backs up the node's ancestors first where the host lacks them.
"""
from __future__ import annotations

import heapq
from typing import Any, NamedTuple

import torch

from radixserve.kvcache.allocator import PageAllocator
from radixserve.kvcache.base import MatchResult
from radixserve.kvcache.radix import RadixNode, RadixPrefixCache, _check, _is_root, check_pages


class CopyOrder(NamedTuple):
    """Copy the KV at `device` slots to `host` slots or back (same length, whole pages)."""

    device: torch.Tensor
    host: torch.Tensor
    node: RadixNode  # whose host copy it is (the host tier notes when it is written)


class HiRadixPrefixCache(RadixPrefixCache):
    def __init__(self, page_size: int, device: torch.device | str, host_pages: int,
                 write_back: bool) -> None:
        self.host_alloc = PageAllocator(host_pages, page_size, "cpu")
        self.write_back = write_back
        super().__init__(page_size, device)

    def reset(self) -> None:
        super().reset()
        self.host_alloc.reset()
        self._host_tokens = 0
        self.writes: list[CopyOrder] = []  # backups decided, not yet handed to the host tier
        self.loads: list[CopyOrder] = []
        self.evicted_ready: list[object] = []  # `host_ready` of nodes evicted to the host tier

    def take(self, name: str) -> list:
        """What `writes`, `loads` or `evicted_ready` noted since the last take of it."""
        out = getattr(self, name)
        setattr(self, name, [])
        return out

    @property
    def host_tokens(self) -> int:
        """Tokens whose KV the host tier holds."""
        return self._host_tokens

    @property
    def host_slots_total(self) -> int:
        return self.host_alloc.num_pages * self.page_size

    def _dev_len(self, node: RadixNode) -> int:
        return len(node.key) if node.on_device else 0

    def _is_leaf(self, node: RadixNode) -> bool:
        return node.on_device and not any(c.on_device for c in node.children.values())

    def match_prefix(self, input_ids: list[int], namespace: int = 0) -> MatchResult:
        node, matched, path = self._walk(tuple(input_ids), self._tick(), namespace)
        device = [n for n in path if n.on_device]  # (a prefix of the path)
        host_len = matched - sum(len(n.key) for n in device)
        return MatchResult(node, matched - host_len, self._slots(device), host_len)

    def load_back(self, handle: Any, slots: torch.Tensor) -> MatchResult:
        """Give the host-only nodes of the locked match `handle` the device `slots` (as many as
        its `host_len`, allocated by the caller) and order their copies (`loads`): the match,
        now all on the device."""
        path = self._path(handle)
        host = [n for n in path if not n.on_device]
        assert sum(len(n.key) for n in host) == len(slots), "slots for the host part only"
        assert handle.ref > 0, "load_back of an unlocked match"
        pos = 0
        for node in host:
            n = len(node.key)
            self._to_device(node, slots[pos : pos + n].to(self.device, torch.int64, copy=True))
            self.loads.append(CopyOrder(node.indices, node.host, node))
            pos += n
        return MatchResult(handle, sum(len(n.key) for n in path), self._slots(path))

    def insert_prefix(self, input_ids: list[int], indices: torch.Tensor, namespace: int = 0) -> int:
        ids = tuple(input_ids)
        assert len(ids) % self.page_size == 0, f"insert of {len(ids)} tokens is not page-aligned"
        assert len(indices) == len(ids), f"{len(ids)} tokens but {len(indices)} slots"
        tick = self._tick()
        node, matched, path = self._walk(ids, tick, namespace)
        device_matched = pos = self._device_prefix(path)
        for n in [m for m in path if not m.on_device]:
            # host-only: it takes the caller's copy of its KV instead of a load
            self._to_device(n, indices[pos : pos + len(n.key)].to(self.device, torch.int64,
                                                                   copy=True))
            pos += len(n.key)
        if matched < len(ids):
            child = RadixNode(ids[matched:], indices[matched:].to(self.device, torch.int64,
                                                                  copy=True), node, tick)
            node.children[child.key[: self.page_size]] = child
            self._leaves.discard(node)
            self._leaves.add(child)
            self._evictable += len(child.key)
            if not self.write_back:
                self._backup(child)
        return device_matched

    def evict(self, num_tokens: int) -> torch.Tensor:
        heap = [(n.last_access, n.uid, n) for n in self._leaves] if num_tokens > 0 else []
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        num_freed = 0
        while num_freed < num_tokens and heap:
            node = heapq.heappop(heap)[2]
            parent = node.parent
            assert parent is not None and node.ref == 0 and self._is_leaf(node)
            self._leaves.remove(node)
            self._evictable -= len(node.key)
            num_freed += len(node.key)
            freed.append(node.indices)
            if node.host is not None:
                self.evicted_ready.append(node.host_ready)
                node.indices = None  # the host tier keeps it
            elif self.write_back and self._backup(node):
                node.indices = None
            else:  # (a device leaf the host does not hold has no children)
                assert not node.children, f"{node} has children but no copy left"
                del parent.children[node.key[: self.page_size]]
                node.parent = None
            if not _is_root(parent) and parent.ref == 0 and self._is_leaf(parent):
                self._leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return torch.cat(freed) if freed else self.empty_indices()

    # -- internals ------------------------------------------------------------------------------
    def _path(self, node: RadixNode) -> list[RadixNode]:
        """The nodes from the root's child down to `node`."""
        path = []
        while not _is_root(node):
            path.append(node)
            node = node.parent
        return path[::-1]

    @staticmethod
    def _device_prefix(path: list[RadixNode]) -> int:
        return sum(len(n.key) for n in path if n.on_device)

    def _to_device(self, node: RadixNode, slots: torch.Tensor) -> None:
        """A host-only node (its parent on the device) gets device slots."""
        assert not node.on_device and node.host is not None and len(slots) == len(node.key)
        node.indices = slots
        self._leaves.discard(node.parent)
        if node.ref > 0:
            self._protected += len(node.key)
        else:
            self._evictable += len(node.key)
            if self._is_leaf(node):
                self._leaves.add(node)

    def _backup(self, node: RadixNode) -> bool:
        """Give `node`, and its ancestors the host lacks, host copies, and order the copies;
        False (nothing changed) when the host tier has no room."""
        path = [node]
        while not _is_root(path[-1].parent) and path[-1].parent.host is None:
            path.append(path[-1].parent)
        path.reverse()
        tokens = sum(len(n.key) for n in path)
        pages = self._host_pages(tokens // self.page_size, keep=set(self._path(node)))
        if pages is None:
            return False
        slots = self.host_alloc.pages_to_slots(pages)
        pos = 0
        for n in path:
            n.host = slots[pos : pos + len(n.key)]
            pos += len(n.key)
            self.writes.append(CopyOrder(n.indices, n.host, n))
        self._host_tokens += tokens
        return True

    def _host_pages(self, num_pages: int, keep: set[RadixNode]) -> torch.Tensor | None:
        short = num_pages - self.host_alloc.num_free
        if short > 0 and self._evict_host(short * self.page_size, keep) < short * self.page_size:
            return None
        return self.host_alloc.alloc(num_pages)

    def _host_leaf(self, node: RadixNode, keep: set[RadixNode]) -> bool:
        return (node.host is not None and node.ref == 0 and node not in keep
                and not any(c.host is not None for c in node.children.values()))

    def _evict_host(self, num_tokens: int, keep: set[RadixNode]) -> int:
        """Drop host copies, least recently used first, until `num_tokens` are free or nothing
        can go: a host-only node leaves the tree, a node on the device keeps its device copy.
        Returns the tokens freed. NOTE: the eviction freed the pages only when the host tier's
        in-flight loads are done; the host tier orders its writes after them."""
        heap = [(n.last_access, n.uid, n) for n in self._nodes() if self._host_leaf(n, keep)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[2]
            self.host_alloc.free(self.host_alloc.slots_to_pages(node.host))
            self._host_tokens -= len(node.key)
            freed += len(node.key)
            node.host, node.host_ready = None, None
            parent = node.parent
            if not node.on_device:  # (its children would be host-only, so it has none)
                assert not node.children, f"{node}: host-only with children"
                del parent.children[node.key[: self.page_size]]
                node.parent = None
            if not _is_root(parent) and self._host_leaf(parent, keep):
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return freed

    def check_integrity(self) -> None:
        super().check_integrity()
        hosts, host_tokens = [], 0
        for node in self._nodes():
            parent = node.parent
            _check(node.on_device or node.host is not None, f"{node} is in neither tier")
            _check(not node.on_device or _is_root(parent) or parent.on_device,
                   f"{node} is on the device but its parent is not")
            if node.host is not None:
                _check(len(node.host) == len(node.key),
                       f"{node}: {len(node.host)} host slots for {len(node.key)} tokens")
                _check(_is_root(parent) or parent.host is not None,
                       f"{node} is in the host tier but its parent is not")
                hosts.append(node.host)
                host_tokens += len(node.key)
        check_pages(hosts, self.page_size, "host ")
        _check(host_tokens == self._host_tokens,
               f"host tier counts {self._host_tokens} tokens, the tree holds {host_tokens}")
        free = self.host_alloc.num_free * self.page_size
        _check(free + host_tokens == self.host_slots_total,
               f"host tier: free {free} + held {host_tokens} != {self.host_slots_total}")
        self.host_alloc.check_integrity()
        if hosts:
            free_slots = self.host_alloc.pages_to_slots(self.host_alloc.free_pages())
            _check(not torch.isin(torch.cat(hosts), free_slots).any(),
                   "a host slot is both free and in the tree")
