"""A decode step that verifies drafts (`speculative/`). Each drafting request's last token and its
drafts, written into its token-pool row after that token, go through the target in one forward
pass, which computes their KV and its logits at each of them; every other request brings its
last token as in any step. The step is read at once: what the target keeps of each request's
drafts (`speculative/verify.py`) sets its KV length (the rejected drafts' KV is no longer its)
and the next step's input token.

The pass is a decode batch of a row a token (`token_rows`) where the engine runs one
(`Engine.verifies_as_decode`): the drafted row j of a request at KV length L reads positions
0..L + j, the rows before it storing theirs in the same pass, as plain decoding's steps would
one after another, so the decode CUDA graphs replay it. Otherwise it is an extend of each
request's tokens (`verify_rows` picks its logits).

Invariant after the step, for a drafting request that kept `a` of its `d` drafts: `kv_len` counts
its last token and the `a` kept drafts (their KV is computed), its row holds the target's own token
at `kv_len`, the next step's input; the rejected drafts' KV rows past it are written over by the
steps to come."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.core.request import Req
from radixserve.engine.sampler import plain_probs
from radixserve.scheduler.inflight import ForwardPass, InFlight
from radixserve.scheduler.verify_tree import TreeStep, commit
from radixserve.speculative.tree import walk_greedy, walk_sampled
from radixserve.speculative.verify import Verified, plain_greedy, verify
from radixserve.utils.tensor import to_device

if TYPE_CHECKING:
    from radixserve.scheduler.scheduler import Scheduler


def write_drafts(token_pool: torch.Tensor, drafts: dict[Req, list[int]]) -> None:
    """Each request's drafts into its row after its last token (one indexed write)."""
    rows = [req.row for req, d in drafts.items() for _ in d]
    cols = [req.kv_len + 1 + j for req, d in drafts.items() for j in range(len(d))]
    where = to_device([rows, cols], token_pool.device)
    token_pool[where[0], where[1]] = to_device([t for d in drafts.values() for t in d],
                                               token_pool.device)


class TokenAt(NamedTuple):
    """One token of a request as a decode row: the request's page-table row, and the KV length
    before the token (its position)."""

    row: int
    kv_len: int


def token_rows(items: list[tuple[Req, int]],
               trees: dict[Req, TreeStep] | None = None) -> list[tuple[TokenAt, int]]:
    """A verification step's items (each request and its token count) as decode rows, a token
    each, in order: the logits come in `verify_rows`' order, every row being needed. A tree's
    nodes each read their own path through a scratch row (`verify_tree.py`)."""
    out = []
    for r, n in items:
        step = trees.get(r) if trees else None
        if step is None:
            out += [(TokenAt(r.row, r.kv_len + j), 1) for j in range(n)]
        else:
            out.append((TokenAt(r.row, r.kv_len), 1))
            out += [(TokenAt(row, r.kv_len + d), 1)
                    for row, d in zip(step.rows, step.tree.depths())]
    return out


def verify_rows(items: list[tuple[Req, int]], drafts: dict[Req, list[int]]) -> list[int]:
    """The batch's tokens whose logits the step needs: every token of a drafting request's item
    (its last token and each draft), the last of every other item."""
    rows, start = [], 0
    for req, n in items:
        rows += range(start, start + n) if req in drafts else [start + n - 1]
        start += n
    return rows


def _item_rows(items: list[tuple[Req, int]], drafts: dict[Req, list[int]]) -> list[int]:
    """Each item's first row in the logits of `verify_rows`."""
    first, at = [], 0
    for req, _ in items:
        first.append(at)
        at += 1 + len(drafts[req]) if req in drafts else 1
    return first


@torch.inference_mode()
def sample_verified(sched: Scheduler, fwd: ForwardPass) -> InFlight:
    """The step's tokens on the host, drafting requests' runs verified, the next inputs stored."""
    items, emits, logits, drafts = fwd.items, fwd.emits, fwd.logits, fwd.drafts
    first = _item_rows(items, drafts)
    runs: dict[int, Verified] = {}
    plain = [i for i in emits if items[i][0] not in drafts]
    if plain:  # as any step samples them, grammar masks included
        sub = logits[to_device([first[i] for i in plain], sched.device)]
        masked = [(j, r.grammar) for j, i in enumerate(plain)
                  if (r := items[i][0]).grammar is not None and not (r.finished or r.aborted)]
        if masked:
            for j in sched.grammars.mask(sub, masked):
                items[plain[j]][0].grammar.dead_end = True
        res = sched.sampler.sample(sub, [items[i][0] for i in plain])
        tokens = res.tokens.tolist()
        invalid = res.invalid.tolist() if res.invalid is not None else [False] * len(plain)
        lps = res.chosen_logprob.tolist() if res.chosen_logprob is not None else None
        for j, i in enumerate(plain):
            k = items[i][0].params.logprobs
            lp = top = None
            if lps is not None and k is not None:
                lp = [lps[j]]
                top = [list(zip(res.top_ids[j, :k].tolist(), res.top_logprobs[j, :k].tolist()))]
            runs[i] = Verified([tokens[j]], lp, top, invalid[j])
    verifying = [i for i in emits if items[i][0] in drafts]
    # the argmax of every row of the plain greedy requests, read in one copy for the step (of
    # every row, then picked: gathering whole rows of logits first costs a vocabulary's copy each)
    greedy = [i for i in verifying if plain_greedy(items[i][0])]
    best: dict[int, list[int]] = {}
    if greedy:
        at = [first[i] + j for i in greedy for j in range(len(drafts[items[i][0]]) + 1)]
        flat = logits.argmax(-1)[to_device(at, sched.device)].tolist()
        for i in greedy:
            n = len(drafts[items[i][0]]) + 1
            best[i], flat = flat[:n], flat[n:]
    trees = fwd.trees or {}
    for i in verifying:
        req = items[i][0]
        d = drafts[req]
        if req in trees:
            run = _walk_tree(sched, req, trees[req], logits[first[i]: first[i] + len(d) + 1],
                             best.get(i))
        else:
            run = verify(logits[first[i]: first[i] + len(d) + 1], d, req, sched.sampler.eos_ids,
                         sched.sampler.generator, best.get(i))
        runs[i] = run
        kept = max(0, len(run.tokens) - 1)
        # (a tree counts as drafting its depth, the most it could keep: the adaptive length
        # and the acceptance metrics compare like with a chain's)
        sched.spec.record(req, max(trees[req].tree.depths()) if req in trees else len(d), kept)
        req.kv_len -= len(d) - kept  # the rejected drafts' KV is not the request's
    live = [i for i in emits if runs[i].tokens and not runs[i].invalid]
    if live:  # each request's last token: the next step's input, at its KV length
        cap = sched.table.max_seq_len - 1
        rows = to_device([items[i][0].row for i in live], sched.device)
        cols = to_device([min(items[i][0].kv_len, cap) for i in live], sched.device)
        sched.table.token_pool[rows, cols] = to_device([runs[i].tokens[-1] for i in live],
                                                       sched.device)
    return InFlight(items, emits, None, None, fwd.prompt_lp, fwd.embeds, runs)


def _walk_tree(sched: Scheduler, req: Req, step: TreeStep, logits: torch.Tensor,
               best: list[int] | None) -> Verified:
    """The kept path of a request's tree (`Speculator.takes_tree`: greedy, or a draw from its
    plain distribution at each node), committed to its rows."""
    p = req.params
    if p.is_greedy:
        walk = walk_greedy(step.tree, best if best is not None else logits.argmax(-1).tolist())
    else:
        probs = torch.stack([plain_probs(row, p) for row in logits.float()])
        walk = walk_sampled(step.tree, probs, req.generator or sched.sampler.generator)
    # (the step added the request's last token and every node to its KV length)
    commit(sched, req, step, walk, req.kv_len - 1 - len(step.tree.tokens))
    return Verified(walk.tokens)
