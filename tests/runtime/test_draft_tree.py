"""A tree of drafts: candidates merged into a trie, the kept path walked greedily (the target's
argmax at each node) or by sampling (each child a point mass tried against the residual: the
token taken at every position is distributed as the target's own p, checked by a seeded
chi-square with biased walks as negative controls), and each node's page-table row."""
from __future__ import annotations

import torch

from radixserve.speculative.tree import DraftTree, Walk, walk_greedy, walk_sampled
from tests.runtime.test_speculative import ALPHA, _chi2_pvalue


def test_candidates_sharing_a_start_share_its_nodes() -> None:
    tree = DraftTree.from_paths([[5, 6, 7], [5, 8], [9, 6], [5, 6, 2]], most=8)
    assert tree.tokens == [5, 6, 7, 8, 9, 6, 2]
    assert tree.parents == [-1, 0, 1, 0, -1, 4, 1]
    assert tree.depths() == [1, 2, 3, 2, 1, 2, 3]
    assert tree.children(-1) == [0, 4] and tree.children(1) == [2, 6]
    assert tree.path(6) == [0, 1, 6]
    # the nodes run out: later candidates are cut where they would need more
    small = DraftTree.from_paths([[5, 6, 7], [5, 8, 1], [9]], most=4)
    assert small.tokens == [5, 6, 7, 8] and small.parents == [-1, 0, 1, 0]
    assert DraftTree.chain([3, 4, 5]) == DraftTree([3, 4, 5], [-1, 0, 1])


def test_the_greedy_walk_follows_the_argmax() -> None:
    tree = DraftTree.from_paths([[5, 6, 7], [5, 8], [9, 6]], most=8)
    # nodes: 0:5  1:6(0)  2:7(1)  3:8(0)  4:9  5:6(4); best[0] at the root, best[1 + i] at node i
    assert walk_greedy(tree, [9, 0, 0, 0, 0, 6, 3]) == Walk([4, 5], [9, 6, 3])
    assert walk_greedy(tree, [5, 8, 0, 0, 4, 0, 0]) == Walk([0, 3], [5, 8, 4])
    assert walk_greedy(tree, [5, 6, 7, 1, 0, 0, 0]) == Walk([0, 1, 2], [5, 6, 7, 1])
    assert walk_greedy(tree, [2, 0, 0, 0, 0, 0, 0]) == Walk([], [2])  # no child holds it
    # a chain walks as the chain verifier keeps: drafts up to the first miss, then the target's
    chain = DraftTree.chain([4, 4, 1])
    assert walk_greedy(chain, [4, 4, 2, 0]) == Walk([0, 1], [4, 4, 2])


def test_each_nodes_row_reads_its_own_path(tiny_ckpts) -> None:
    """A staged tree: each node's scratch row holds the request's slots through its last token,
    then its ancestors' slots and its own, and its token at its depth; committed with no node
    kept, every slot and row comes back."""
    from radixserve import SamplingParams
    from radixserve.scheduler import verify_tree
    from tests.runtime.test_speculative import _scheduler

    s = _scheduler(tiny_ckpts["qwen3"], overlap=False)
    s.add_request(0, list(range(1, 11)), SamplingParams(max_tokens=8, ignore_eos=True))
    s.step()  # the prompt's KV, then its first token
    req = s.reqs[0]
    free_rows, free_pages = s.table.num_free, s.cache.num_free_pages
    tree = DraftTree.from_paths([[5, 6], [5, 8], [9]], most=8)  # 0:5  1:6(0)  2:8(0)  3:9
    step = verify_tree.stage(s, req, tree)
    last = req.kv_len
    prefix = s.table.page_table[req.row, : last + 1].tolist()
    own = step.slots.tolist()
    paths = [[0], [0, 1], [0, 2], [3]]
    for node, (row, path) in enumerate(zip(step.rows, paths)):
        assert s.table.page_table[row, : last + 1 + len(path)].tolist() == prefix + [
            own[n] for n in path], node
        assert int(s.table.token_pool[row, last + len(path)]) == tree.tokens[node]
    assert len(set(own)) == 4 and not set(own) & set(prefix)
    verify_tree.commit(s, req, step, Walk([], [9]), last)  # no node kept
    assert (s.table.num_free, s.cache.num_free_pages) == (free_rows, free_pages)


def _first_tokens(walk, n: int = 3000) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Over `n` walks of a tree whose root has three children (the root's three likeliest
    tokens, one of which has a child of its own), the counts of the first token taken, of the
    second where that child's parent was kept, and the target's p at both places."""
    g = torch.Generator().manual_seed(11)
    p_root = torch.softmax(torch.tensor([2.0, 1.5, 0.5, 0.0, -1.0, 0.3]), -1)
    p_node = torch.softmax(torch.tensor([0.1, 1.9, 1.8, -0.5, 0.0, 1.0]), -1)
    tree = DraftTree.from_paths([[0, 1], [1], [2]], most=8)  # nodes 0:0 1:1(0) 2:1 3:2
    probs = torch.stack([p_root, p_node, p_root, p_root, p_root])
    first, second = torch.zeros(6), torch.zeros(6)
    for _ in range(n):
        w = walk(tree, probs, g)
        first[w.tokens[0]] += 1
        if w.nodes[:1] == [0]:  # node 0 kept: the second token is drawn at it
            second[w.tokens[1]] += 1
    return first, second, p_root, p_node


def test_sampled_walks_keep_the_targets_distribution() -> None:
    first, second, p_root, p_node = _first_tokens(walk_sampled)
    assert _chi2_pvalue(first, p_root * first.sum()) > ALPHA
    assert _chi2_pvalue(second, p_node * second.sum()) > ALPHA


def test_biased_walks_fail_the_same_check() -> None:
    """Negative controls: trying each child against p itself (no residual), or drawing the
    target's token from p after the children failed (not from what they left), skews the first
    token."""

    def against_p(tree, probs, g):
        at, nodes = -1, []
        while True:
            p = probs[at + 1]
            kept = next((c for c in tree.children(at)
                         if float(torch.rand((), generator=g)) < float(p[tree.tokens[c]])), None)
            if kept is None:
                return Walk(nodes, [tree.tokens[n] for n in nodes]
                            + [int(torch.multinomial(p, 1, generator=g)[0])])
            nodes.append(kept)
            at = kept

    def draws_from_p(tree, probs, g):
        at, nodes = -1, []
        while True:
            r = probs[at + 1].double().clone()
            kept = None
            for c in tree.children(at):
                if float(torch.rand((), generator=g, dtype=torch.float64)) < float(
                        r[tree.tokens[c]]) / float(r.sum()):
                    kept = c
                    break
                r[tree.tokens[c]] = 0.0
            if kept is None:
                return Walk(nodes, [tree.tokens[n] for n in nodes]
                            + [int(torch.multinomial(probs[at + 1], 1, generator=g)[0])])
            nodes.append(kept)
            at = kept

    for biased in (against_p, draws_from_p):
        first, _, p_root, _ = _first_tokens(biased)
        assert _chi2_pvalue(first, p_root * first.sum()) < ALPHA, biased.__name__


def test_trees_keep_the_greedy_tokens_and_every_slot(tiny_ckpts, monkeypatch) -> None:
    """Trees whose first candidate goes wrong (at the first token, or past a shared first one)
    and whose second holds plain decoding's tokens: the walk takes the second, every node a
    decode row reading its own path, so the output is plain decoding's, no slot or row leaked
    (the integrity check after every step), the tree's kept KV read by the steps after."""
    from radixserve import SamplingParams
    from radixserve.speculative import ngram
    from tests.runtime.helpers import drain
    from tests.runtime.test_speculative import _prompts, _scheduler, _tokens

    path = tiny_ckpts["qwen3"]
    prompts = _prompts(300)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)

    def run(s) -> dict[int, list[int]]:
        for uid, p in enumerate(prompts):
            s.add_request(uid, p, sp)
        return _tokens(drain(s, every_step=True))

    plain = run(_scheduler(path))
    by_prompt = {tuple(p): plain[uid] for uid, p in enumerate(prompts)}
    shapes, expect = [], []

    def paths(self, reqs, lengths, breadth):
        """Two candidates within k nodes: a wrong one first, then plain decoding's tokens."""
        out = []
        for r, k in zip(reqs, lengths):
            done = len(r.output_ids)
            right = by_prompt[tuple(r.input_ids)][done: done + (2 if k >= 4 else 1)]
            if not right:
                out.append([])
                continue
            wrong = [(t + 1) % 300 for t in right]
            if k == 1:  # no room for two: the right token alone
                first = right
            elif len(shapes) % 2 or len(right) < 2:  # wrong from the first token on
                first = wrong[: k - len(right)]
            else:  # the right first token, then a wrong one (3 nodes)
                first = right[:1] + wrong[1:]
            shapes.append(first[0] == right[0] and first != right)
            expect.append(len(right))  # what the walk keeps: the whole right candidate
            out.append([first, right])
        return out

    monkeypatch.setattr(ngram.NgramDrafter, "propose_paths", paths)
    s = _scheduler(path, speculative_algorithm="ngram", speculative_ngram_max_bfs_breadth=2)
    assert run(s) == plain
    # both shapes drafted (wrong from the first token; right first token, then wrong), and
    # every right candidate kept whole: no tree fell back to its first candidate
    assert True in shapes and False in shapes
    assert s.stats()["spec_accepted_tokens"] == sum(expect) > 0
    assert s.table.num_free == s.table.max_reqs - 1  # every scratch row back (and the requests')


def test_sampled_requests_walk_their_trees_and_leak_nothing(tiny_ckpts, monkeypatch) -> None:
    """Sampled requests draft trees too (each node tried against the residual); whatever each
    walk keeps, every slot and scratch row comes back (the integrity check after each step) and
    every request gets its max_tokens."""
    from radixserve import SamplingParams
    from radixserve.scheduler import verify_step
    from tests.runtime.test_speculative import _scheduler

    walks = []
    commit = verify_step.commit
    monkeypatch.setattr(verify_step, "commit",
                        lambda s, req, step, walk, last: walks.append(walk)
                        or commit(s, req, step, walk, last))
    s = _scheduler(tiny_ckpts["qwen3"], speculative_algorithm="ngram",
                   speculative_ngram_max_bfs_breadth=3, speculative_ngram_min_match_window_size=1)
    g = torch.Generator().manual_seed(5)
    for uid in range(4):  # a few token ids: each recurs with several continuations
        s.add_request(uid, torch.randint(1, 6, (30,), generator=g).tolist(),
                      SamplingParams(temperature=0.8, top_k=3, max_tokens=24, ignore_eos=True,
                                     seed=uid))
    got: dict[int, int] = {}
    while s.has_work:
        for o in s.step():
            got[o.uid] = got.get(o.uid, 0) + 1
        s.check_integrity()
    assert got == {uid: 24 for uid in range(4)}
    assert walks and any(w.nodes for w in walks)  # trees walked, some nodes kept


def test_a_tree_needs_ngram_and_pages_of_one_token(tiny_ckpts) -> None:
    import pytest

    from radixserve.config import SchedulerConfig
    from tests.runtime.test_speculative import _scheduler

    with pytest.raises(ValueError, match="needs --speculative-algorithm ngram"):
        SchedulerConfig(speculative_algorithm="draft", speculative_draft_model_path="x",
                        speculative_ngram_max_bfs_breadth=2)
    SchedulerConfig(speculative_ngram_max_bfs_breadth=2)  # (no speculation: nothing to refuse)
    with pytest.raises(ValueError, match="needs --page-size 1, got 4"):
        _scheduler(tiny_ckpts["qwen3"], page_size=4, speculative_algorithm="ngram",
                   speculative_ngram_max_bfs_breadth=2)
