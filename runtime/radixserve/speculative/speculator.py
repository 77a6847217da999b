"""The scheduler's side of speculative decoding: which running requests draft how many tokens this
step (`plan`), what the target keeps of them (`verify.py`), and the counts the metrics and each
reply's usage report.

A request does not draft (it decodes one token a step, as without speculation) while its drafts
would not pay or could not be verified exactly here: penalties (their counts would move within the
drafted run), a grammar (its matcher is advanced token by token), the last token it may produce
(`max_tokens`), or its prompt logprobs still to come. No request drafts while more requests
decode than `--speculative-disable-by-batch-size` (`max_batch`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.speculative.adaptive import DraftLengths, FixedDraftLengths
from radixserve.speculative.tree import DraftTree

if TYPE_CHECKING:
    from radixserve.core.request import Req
    from radixserve.speculative.drafter import BaseDrafter


class Speculator:
    def __init__(self, drafter: BaseDrafter, most: int, max_batch: int | None = None,
                 adaptive: bool = True, breadth: int = 1, nodes: int | None = None) -> None:
        """`most`: the most drafts on a path. `adaptive` False: every request drafts `most`
        tokens a step (`FixedDraftLengths`). `breadth` > 1: up to that many candidates a
        request, verified as a tree of at most `nodes` nodes (default `most`;
        `speculative/tree.py`)."""
        self.drafter, self.breadth, self.nodes = drafter, breadth, nodes or most
        self.lengths = DraftLengths(most) if adaptive else FixedDraftLengths(most)
        self.max_batch = max_batch
        self.drafted = self.accepted = self.verify_steps = 0  # totals, for the metrics

    @staticmethod
    def _may_draft(req: Req) -> int:
        """How many tokens the request could take beyond its next one (0: it must not draft)."""
        p = req.params
        if p.has_penalties or req.grammar is not None or p.constrained:
            return 0
        return max(0, p.max_tokens - len(req.output_ids) - 1)

    def may_draft(self, reqs: list[Req]) -> bool:
        """Whether any of the requests may draft in the next step (its step then reads the tokens
        of the step before first)."""
        decoding = [r for r in reqs if r.prefill_done]
        return not self._too_many(decoding) and any(
            self._may_draft(r) and self.lengths.wants(r.uid) for r in decoding)

    def _too_many(self, decoding: list[Req]) -> bool:
        return self.max_batch is not None and len(decoding) > self.max_batch

    @staticmethod
    def takes_tree(req: Req) -> bool:
        """Whether the request's drafts may branch: its token at each node is the argmax or a
        draw from its plain distribution (a walk of the tree, `speculative/tree.py`)."""
        return (not req.params.adjusts_logits and req.params.logprobs is None
                and req.lora is None)  # (a scratch row carries no adapter slot)

    def plan(self, reqs: list[Req]) -> tuple[dict[Req, list[int]], dict[Req, DraftTree]]:
        """The drafts of the requests that draft this step (none drafted: absent), and the
        trees among them (their drafts: the tree's tokens, node by node)."""
        # no more drafts than the KV slots it holds past its next token (optimistic admission
        # grows them where pages are free: `Scheduler._grow_draft_kv`)
        lengths = [] if self._too_many(reqs) else [
            max(0, min(self.lengths.next(r.uid), self._may_draft(r), r.num_slots - r.kv_len - 1))
            for r in reqs]
        self.lengths.tick()
        if not any(lengths):
            return {}, {}
        if self.breadth == 1:
            proposals = self.drafter.propose(reqs, lengths)
            return {r: d[:n] for r, d, n in zip(reqs, proposals, lengths) if n and d}, {}
        drafts: dict[Req, list[int]] = {}
        trees: dict[Req, DraftTree] = {}
        for r, paths, n in zip(reqs, self.drafter.propose_paths(reqs, lengths, self.breadth),
                               lengths):
            if not (n and paths):
                continue
            if not self.takes_tree(r):
                drafts[r] = paths[0][:n]
                continue
            # room for every candidate a path as deep as the request drafts (where its drafts
            # keep failing it drafts one token: each candidate's first still counts)
            tree = DraftTree.from_paths([p[:n] for p in paths], min(self.nodes, n * self.breadth))
            if tree.is_chain:
                drafts[r] = paths[0][:n]
            else:
                drafts[r], trees[r] = tree.tokens, tree
        return drafts, trees

    def record(self, req: Req, drafted: int, kept: int) -> None:
        self.lengths.observe(req.uid, drafted, kept)
        req.spec_drafted += drafted
        req.spec_accepted += kept
        req.spec_steps += 1
        self.drafted += drafted
        self.accepted += kept
        self.verify_steps += 1

    def release(self, req: Req) -> None:
        self.lengths.forget(req.uid)
        self.drafter.release(req)
