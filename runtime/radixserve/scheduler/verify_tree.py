"""A verification step's trees of drafts (`speculative/tree.py`), page size 1.

Each node gets a KV slot of its own and a scratch row of the table (`stage`): the row holds the
request's page-table row up to its last token (position L), then the slots of the node's
ancestors and its own, and the node's token at its position L + depth; so the node is a decode
row like any other (`TokenAt(scratch row, L + depth)`) that reads exactly its path, whatever
the backend. After the step (`commit`) the kept path's slots take positions L + 1 .. L + m of
the request's own row (the slots they displace go back, as do the other nodes' and the scratch
rows), and its tokens the same places of its token-pool row."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.speculative.tree import DraftTree, Walk
from radixserve.utils.tensor import to_device

if TYPE_CHECKING:
    from radixserve.config import SchedulerConfig
    from radixserve.core.request import Req
    from radixserve.scheduler.scheduler import Scheduler

MAX_SCRATCH_ROWS = 64  # past them a request's tree falls back to its first candidate


def tree_scratch_rows(cfg: SchedulerConfig) -> int:
    """Table rows kept for trees' nodes: a full tree for every running request, up to
    `MAX_SCRATCH_ROWS` (each row is a page-table and a token-pool row of the longest context)."""
    return min(MAX_SCRATCH_ROWS, cfg.max_running_requests * cfg.speculative_num_draft_tokens)


class TreeStep(NamedTuple):
    tree: DraftTree
    rows: list[int]  # node i's scratch row
    slots: torch.Tensor  # node i's KV slot


def stage(sched: Scheduler, req: Req, tree: DraftTree) -> TreeStep | None:
    """Rows and KV slots for the tree's nodes, written (None where free rows or free pages are
    short: the prefix cache is not evicted for a guess)."""
    n = len(tree.tokens)
    table = sched.table
    if table.num_free < n or n > sched.cache.num_free_pages:
        return None
    slots = sched.cache.allocate(n)
    if slots is None:
        return None
    rows = [table.alloc_row() for _ in range(n)]
    pt, tp, last = table.page_table, table.token_pool, req.kv_len
    dev = pt.device
    pt[to_device(rows, dev), : last + 1] = pt[req.row, : last + 1]
    depths = tree.depths()
    slot_list = slots.tolist()
    r_idx, c_idx, vals = [], [], []
    for i, row in enumerate(rows):
        for d, node in enumerate(tree.path(i), start=1):
            r_idx.append(row)
            c_idx.append(last + d)
            vals.append(slot_list[node])
    where = to_device([r_idx, c_idx], dev)
    pt[where[0], where[1]] = to_device(vals, dev).to(pt.dtype)
    tp[to_device(rows, dev), to_device([last + d for d in depths], dev)] = to_device(
        tree.tokens, dev).to(tp.dtype)
    return TreeStep(tree, rows, slots)


def commit(sched: Scheduler, req: Req, step: TreeStep, walk: Walk, last: int) -> None:
    """The kept path into the request's rows, after its last token at `last`; every other
    node's slot, the slots the path displaces and the scratch rows back."""
    pt, tp = sched.table.page_table, sched.table.token_pool
    kept = walk.nodes
    back = [slot for i, slot in enumerate(step.slots.tolist()) if i not in kept]
    if kept:
        cols = list(range(last + 1, last + 1 + len(kept)))
        held = [c for c in cols if c < req.num_slots]
        if held:
            back += pt[req.row, held[0]: held[-1] + 1].tolist()
        dev = pt.device
        pt[req.row, cols[0]: cols[-1] + 1] = step.slots[to_device(kept, step.slots.device)].to(
            dev, pt.dtype)
        tp[req.row, cols[0]: cols[-1] + 1] = to_device(walk.tokens[: len(kept)], dev).to(tp.dtype)
        req.num_slots = max(req.num_slots, cols[-1] + 1)
    if back:
        sched.cache.free(torch.tensor(back, dtype=step.slots.dtype, device=step.slots.device))
    for row in step.rows:
        sched.table.free_row(row)
