"""A tree of drafts (`--speculative-eagle-topk` > 1, or several n-gram matches): candidates that
share their first tokens share nodes, so one verification step checks several continuations.

Node i holds `tokens[i]` and its parent `parents[i]` (-1: the request's last token, the root);
parents come before their children. The target's logits at the root and at each node say what
it would produce next; the kept run is a path from the root (`walk_greedy`, `walk_sampled`),
then the target's own token.

Verification as decode rows (`scheduler/verify_step.py`) takes a tree as it takes a chain: node
i at depth d is a decode row at position L + d whose page-table row holds the request's L + 1
slots, then its ancestors' slots and its own (`verify_tree.stage`), so it reads exactly its path
(page size 1: a slot a token)."""
from __future__ import annotations

from typing import NamedTuple

import torch


class DraftTree(NamedTuple):
    tokens: list[int]
    parents: list[int]

    @classmethod
    def from_paths(cls, paths: list[list[int]], most: int) -> DraftTree:
        """The trie of candidate continuations, earlier ones first, at most `most` nodes (a path
        is cut where the nodes run out)."""
        tokens: list[int] = []
        parents: list[int] = []
        child: dict[tuple[int, int], int] = {}
        for path in paths:
            at = -1
            for t in path:
                node = child.get((at, t))
                if node is None:
                    if len(tokens) == most:
                        break
                    node = child[(at, t)] = len(tokens)
                    tokens.append(t)
                    parents.append(at)
                at = node
        return cls(tokens, parents)

    @classmethod
    def chain(cls, drafts: list[int]) -> DraftTree:
        return cls(list(drafts), list(range(-1, len(drafts) - 1)))

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.tokens) - 1))

    def first_path(self) -> list[int]:
        """The tokens of the first candidate (the chain a tree falls back to)."""
        out, at = [], -1
        while (kids := self.children(at)):
            at = kids[0]
            out.append(self.tokens[at])
        return out

    def depths(self) -> list[int]:
        """Each node's depth (a child of the root: 1)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def children(self, node: int) -> list[int]:
        """`node`'s children in order (-1: the root's)."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


Step = list[tuple[int, float]]  # a draft step's likeliest tokens and their log-probabilities


def top_tokens(logits: torch.Tensor, k: int,
               to_target: torch.Tensor | None = None) -> list[Step]:
    """Each row's `k` likeliest tokens, first the argmax (`to_target`: the drafter's ids mapped
    to the target's). At k = 1 no probability is computed (a chain needs none)."""
    if k == 1:
        ids = logits.argmax(-1, keepdim=True)
        lps = torch.zeros(ids.shape)
    else:
        lps, ids = torch.log_softmax(logits.float(), -1).topk(k, -1)
    if to_target is not None:
        ids = to_target[ids]
    return [list(zip(i, lp)) for i, lp in zip(ids.tolist(), lps.tolist())]


def branch_paths(steps: list[Step]) -> list[list[int]]:
    """The candidates of a chain drafted step by step (`steps[d]`: the likeliest tokens at depth
    d + 1, the chain's first): the chain, then each other token as a branch off the chain's
    tokens before it, likeliest first (the draft's probability of the whole path)."""
    chain = [s[0][0] for s in steps]
    branches: list[tuple[float, list[int]]] = []
    prefix = 0.0
    for d, step in enumerate(steps):
        branches += [(prefix + lp, chain[:d] + [t]) for t, lp in step[1:]]
        prefix += step[0][1]
    branches.sort(key=lambda b: -b[0])  # (stable: ties keep the shallower first)
    return [chain] + [path for _, path in branches]


class Walk(NamedTuple):
    nodes: list[int]  # the kept nodes, root's child first
    tokens: list[int]  # their tokens, then the target's own


def walk_greedy(tree: DraftTree, best: list[int]) -> Walk:
    """`best[0]`: the target's argmax at the root, `best[1 + i]` at node i. The kept path
    follows, from the root, the child holding the argmax of where it stands."""
    nodes, at = [], -1
    while True:
        want = best[at + 1]
        nxt = next((c for c in tree.children(at) if tree.tokens[c] == want), None)
        if nxt is None:
            return Walk(nodes, [tree.tokens[n] for n in nodes] + [want])
        nodes.append(nxt)
        at = nxt


def walk_sampled(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Walk:
    """`probs` [1 + N, V]: the target's distribution at the root and at each node (the
    request's sampling applied). At each node its children's tokens are tried in turn, each a
    point mass: kept with probability r(token) under the residual r (p, less the tokens tried
    before, renormalized), so the token taken there is distributed exactly as p; where none is
    kept, the target's token is drawn from the last residual and the walk ends."""
    nodes, at = [], -1
    while True:
        r = probs[at + 1].double().clone()
        kept = None
        for c in tree.children(at):
            t = tree.tokens[c]
            total = float(r.sum())
            if total > 0 and float(torch.rand((), generator=generator, dtype=torch.float64)) \
                    < float(r[t]) / total:
                kept = c
                break
            r[t] = 0.0
        if kept is None:
            tok = int(torch.multinomial(r, 1, generator=generator)[0])
            return Walk(nodes, [tree.tokens[n] for n in nodes] + [tok])
        nodes.append(kept)
        at = kept
