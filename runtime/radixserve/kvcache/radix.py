"""The radix prefix cache: a tree of token runs, split only at page boundaries; one tree per
namespace (the base model's is 0; each LoRA adapter load has its own, `lora/manager.py`), so KV
computed under one adapter is never matched by a request of another.

Invariants (`check_integrity` walks the tree and checks each one):
- a root's key is empty and it has no parent; a non-root node's `key` (token ids) and `indices` (KV slots) have the same non-zero length, a
  multiple of page_size; its parent's `children` holds it under `key[:page_size]`;
- `ref(node) == locks(node) + sum(ref(child))`, where `locks(node)` counts the live `lock` calls
  whose handle is this node; so `ref(node)` is the number of locks whose handle lies in its
  subtree, and `ref(node) >= ref(child)`: a locked node's ancestors are locked too;
- `protected` is the tokens of non-root nodes with ref > 0, `evictable` those with ref == 0;
- `_leaves` is exactly the set of non-root childless nodes with ref == 0 (eviction candidates);
- a parent was accessed no earlier than its child (every walk touches a whole root path), so
  evicting the least recently used leaf never evicts something fresher than what it keeps;
- no slot appears twice, and each page of slots is whole and in order.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any

import torch

from radixserve.kvcache.base import PREFIX_CACHES, BasePrefixCache, MatchResult, SizeInfo


class RadixNode:
    __slots__ = ("children", "host", "host_ready", "indices", "key", "last_access", "locks",
                 "parent", "ref", "uid")
    _uids = itertools.count()

    def __init__(
        self,
        key: tuple[int, ...],
        indices: torch.Tensor | None,
        parent: RadixNode | None,
        last_access: int,
        ref: int = 0,
    ) -> None:
        self.key = key
        self.indices = indices  # device slots; None where only the host tier holds it (hiradix)
        self.host: torch.Tensor | None = None  # host-tier slots (hiradix)
        self.host_ready: object = None  # the host tier's note of when `host` is written
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.ref = ref
        self.locks = 0
        self.last_access = last_access
        self.uid = next(RadixNode._uids)  # tie-break for the eviction heap

    @property
    def on_device(self) -> bool:
        return self.indices is not None

    def __repr__(self) -> str:
        return f"RadixNode(len={len(self.key)}, ref={self.ref}, locks={self.locks})"


@PREFIX_CACHES.register("radix")
class RadixPrefixCache(BasePrefixCache):
    def __init__(self, page_size: int, device: torch.device | str) -> None:
        super().__init__(page_size, device)
        self.reset()

    def reset(self) -> None:
        self._roots: dict[int, RadixNode] = {}
        self._clock = 0
        self._evictable = 0
        self._protected = 0
        self._leaves: set[RadixNode] = set()

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable=self._evictable, protected=self._protected)

    def _root(self, namespace: int) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = RadixNode((), self.empty_indices(), None, 0)
        return root

    def match_prefix(self, input_ids: list[int], namespace: int = 0) -> MatchResult:
        node, matched, path = self._walk(tuple(input_ids), self._tick(), namespace)
        return MatchResult(node, matched, self._slots(path))

    def _slots(self, path: list[RadixNode]) -> torch.Tensor:
        return torch.cat([n.indices for n in path]) if path else self.empty_indices()

    def _dev_len(self, node: RadixNode) -> int:
        """Tokens of the node the device holds (what evictable/protected count)."""
        return len(node.key)

    def _is_leaf(self, node: RadixNode) -> bool:
        """An eviction candidate once unreferenced: a node no child of which the device holds."""
        return not node.children

    def lock(self, handle: Any) -> None:
        node: RadixNode = handle
        assert _is_root(node) or node.parent is not None, "locking an evicted node"
        node.locks += 1
        while node is not None:
            if node.ref == 0 and not _is_root(node):
                self._evictable -= self._dev_len(node)
                self._protected += self._dev_len(node)
                self._leaves.discard(node)
            node.ref += 1
            node = node.parent

    def unlock(self, handle: Any) -> None:
        node: RadixNode = handle
        assert node.locks > 0, "unlock without a matching lock"
        node.locks -= 1
        while node is not None:
            assert node.ref > 0, f"{node} unlocked below zero"
            node.ref -= 1
            if node.ref == 0 and not _is_root(node):
                self._evictable += self._dev_len(node)
                self._protected -= self._dev_len(node)
                if self._is_leaf(node):
                    self._leaves.add(node)
            node = node.parent

    def insert_prefix(self, input_ids: list[int], indices: torch.Tensor, namespace: int = 0) -> int:
        ids = tuple(input_ids)
        assert len(ids) % self.page_size == 0, f"insert of {len(ids)} tokens is not page-aligned"
        assert len(indices) == len(ids), f"{len(ids)} tokens but {len(indices)} slots"
        tick = self._tick()
        node, matched, _ = self._walk(ids, tick, namespace)
        if matched < len(ids):
            new_slots = indices[matched:].to(self.device, torch.int64, copy=True)
            child = RadixNode(ids[matched:], new_slots, node, tick)
            node.children[child.key[: self.page_size]] = child
            self._leaves.discard(node)
            self._leaves.add(child)
            self._evictable += len(child.key)
        return matched

    def evict(self, num_tokens: int) -> torch.Tensor:
        heap = [(n.last_access, n.uid, n) for n in self._leaves] if num_tokens > 0 else []
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        num_freed = 0
        while num_freed < num_tokens and heap:
            node = heapq.heappop(heap)[2]
            parent = node.parent
            assert parent is not None and node.ref == 0 and not node.children
            del parent.children[node.key[: self.page_size]]
            node.parent = None
            self._leaves.remove(node)
            self._evictable -= len(node.key)
            num_freed += len(node.key)
            freed.append(node.indices)
            if not _is_root(parent) and parent.ref == 0 and self._is_leaf(parent):
                self._leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return torch.cat(freed) if freed else self.empty_indices()

    def dfs_order(self, handles: list[Any]) -> list[int]:
        """Indices into `handles` (matches' handles) in depth-first order of the tree, the
        subtree holding more of them first and a node's subtree before the requests matching
        only the node itself (SGLang's dfs-weight): requests that share a prefix come together,
        the most shared one first, those matching nothing last. Ties go to the earliest index."""
        weight: dict[RadixNode, int] = {}
        first: dict[RadixNode, int] = {}
        kids: dict[RadixNode, list[RadixNode]] = {}
        here: dict[RadixNode, list[int]] = {}
        unmatched: list[int] = []
        for i, handle in enumerate(handles):
            node: RadixNode | None = handle
            if node is None:
                unmatched.append(i)
                continue
            here.setdefault(node, []).append(i)
            while node is not None:
                if node not in weight:
                    weight[node], first[node] = 0, i
                    if node.parent is not None:
                        kids.setdefault(node.parent, []).append(node)
                weight[node] += 1
                node = node.parent
        # ascending, so that the heaviest child (the earliest among equals) is popped first
        def heaviest_last(nodes: list[RadixNode]) -> list[tuple[RadixNode, bool]]:
            return [(c, False) for c in sorted(nodes, key=lambda c: (weight[c], -first[c]))]

        order: list[int] = []
        stack = heaviest_last([n for n in weight if n.parent is None])  # a root per namespace
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order += here.get(node, [])
                continue
            stack.append((node, True))
            stack += heaviest_last(kids.get(node, []))
        return order + unmatched

    def cached_slots(self) -> torch.Tensor:
        return self._slots([node for node in self._nodes() if node.on_device])

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _nodes(self) -> list[RadixNode]:
        """Every non-root node, parents before children."""
        out: list[RadixNode] = []
        stack = [c for root in self._roots.values() for c in root.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _walk(
        self, ids: tuple[int, ...], tick: int, namespace: int
    ) -> tuple[RadixNode, int, list[RadixNode]]:
        """Follow `ids` down whole pages of `namespace`'s tree, splitting a node the match ends
        inside, and touching every node matched. Returns the deepest matched node, the matched
        length, the path."""
        ps = self.page_size
        end = len(ids) - len(ids) % ps
        node, pos, path = self._root(namespace), 0, []
        while pos < end:
            child = node.children.get(ids[pos : pos + ps])
            if child is None:
                break
            matched = self._common_pages(child.key, ids, pos, end)
            if matched < len(child.key):
                child = self._split(child, matched)
            child.last_access = tick
            path.append(child)
            node, pos = child, pos + matched
        return node, pos, path

    def _common_pages(
        self, key: tuple[int, ...], ids: tuple[int, ...], pos: int, end: int
    ) -> int:
        """Tokens in whole pages that `key` shares with `ids[pos:end]` (first page known equal)."""
        limit = min(len(key), end - pos)
        if key[:limit] == ids[pos : pos + limit]:
            return limit
        ps, n = self.page_size, self.page_size
        while n < limit and key[n : n + ps] == ids[pos + n : pos + n + ps]:
            n += ps
        return n

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut `node` at `at` tokens; returns the new upper part. `node` keeps the lower part so
        handles pointing at it still mean the same prefix."""
        ps, parent = self.page_size, node.parent
        assert parent is not None and 0 < at < len(node.key) and at % ps == 0
        dev = node.indices
        upper = RadixNode(node.key[:at], None if dev is None else dev[:at], parent,
                          node.last_access, ref=node.ref)
        if node.host is not None:
            upper.host, node.host = node.host[:at], node.host[at:]
            upper.host_ready = node.host_ready
        parent.children[upper.key[:ps]] = upper
        node.key, node.parent = node.key[at:], upper
        node.indices = None if dev is None else dev[at:]
        upper.children[node.key[:ps]] = node
        return upper

    def check_integrity(self) -> None:
        ps, roots = self.page_size, list(self._roots.values())
        for root in roots:
            _check(root.parent is None and not root.key and len(root.indices) == 0,
                   "root has content")
        evictable = protected = 0
        leaves: set[RadixNode] = set()
        slots: list[torch.Tensor] = []
        for node in [*roots, *self._nodes()]:
            child_refs = sum(c.ref for c in node.children.values())
            _check(node.locks >= 0, f"{node} has negative locks")
            _check(
                node.ref == node.locks + child_refs,
                f"{node}: ref != locks + sum(child ref) = {node.locks} + {child_refs}",
            )
            for first_page, child in node.children.items():
                _check(child.parent is node, f"{child} does not point back to its parent")
                _check(child.key[:ps] == first_page, f"{child} is filed under a wrong key")
                _check(child.last_access <= node.last_access or _is_root(node),
                       f"{child} was accessed after its parent {node}")
            if _is_root(node):
                continue
            n = len(node.key)
            _check(n > 0 and n % ps == 0, f"{node}: key length {n} not a positive page multiple")
            if not node.on_device:
                continue
            _check(len(node.indices) == n, f"{node}: {len(node.indices)} slots for {n} tokens")
            if node.ref > 0:
                protected += n
            else:
                evictable += n
                if self._is_leaf(node):
                    leaves.add(node)
            slots.append(node.indices)
        _check(
            (evictable, protected) == (self._evictable, self._protected),
            f"sizes say evictable={self._evictable} protected={self._protected}, "
            f"tree holds {evictable} and {protected}",
        )
        _check(leaves == self._leaves, "eviction candidates differ from the unreferenced leaves")
        check_pages(slots, ps, "")


def check_pages(parts: list[torch.Tensor], ps: int, tier: str) -> None:
    """The slots of `parts` are distinct, non-negative, whole in-order pages."""
    if not parts:
        return
    flat = torch.cat(parts).cpu()
    _check(int(flat.min()) >= 0, f"negative {tier}slot in the tree")
    _check(torch.unique(flat).numel() == flat.numel(), f"a {tier}slot appears twice in the tree")
    pages = flat.view(-1, ps)
    in_order = pages[:, :1] + torch.arange(ps, dtype=flat.dtype)
    _check(bool((pages[:, 0] % ps == 0).all()) and torch.equal(pages, in_order),
           f"{tier}slots in the tree are not whole, in-order pages")


def _is_root(node: RadixNode) -> bool:
    return not node.key  # (an evicted node has no parent either, but keeps its key)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(f"radix cache integrity: {message}")
