"""--speculative-eagle-topk: a draft model's (or an EAGLE-3 head's) chain with, at each step, its
next likeliest tokens branching off it, verified as one tree. Greedy output stays plain
decoding's; a draft that is often second-right keeps more of its drafts than its chain alone."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve import SamplingParams
from radixserve.config import SchedulerConfig
from radixserve.scheduler import verify_step
from radixserve.speculative.tree import branch_paths, top_tokens
from tests.runtime.helpers import drain
from tests.runtime.test_speculative import _prompts, _scheduler, _tokens

BRANCHED = {"speculative_eagle_topk": 3, "speculative_num_steps": 3,
            "speculative_num_draft_tokens": 6}


def test_branches_follow_the_chain_likeliest_path_first() -> None:
    # depth 1: 7 (-0.1), 8 (-2.5); depth 2: 9 (-0.2), 4 (-1.0); depth 3: 3 (-0.3), 2 (-4.0)
    steps = [[(7, -0.1), (8, -2.5)], [(9, -0.2), (4, -1.0)], [(3, -0.3), (2, -4.0)]]
    # the path's log-probability: [7, 4] -1.1, [8] -2.5, [7, 9, 2] -4.3
    assert branch_paths(steps) == [[7, 9, 3], [7, 4], [8], [7, 9, 2]]
    assert branch_paths([[(5, 0.0)], [(6, 0.0)]]) == [[5, 6]]  # top-1: the chain alone


def test_top_tokens_are_the_argmax_first_then_the_likeliest() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.5, 0.0, 4.0]])
    assert [[t for t, _ in s] for s in top_tokens(logits, 3)] == [[1, 3, 2], [0, 3, 1]]
    lp = torch.log_softmax(logits, -1)
    assert top_tokens(logits, 2)[1][1][1] == pytest.approx(float(lp[1, 3]))
    assert [s[0][0] for s in top_tokens(logits, 1)] == [1, 0]
    to_target = torch.tensor([10, 11, 12, 13])  # a head's draft ids mapped to the target's
    assert [t for t, _ in top_tokens(logits, 2, to_target)[0]] == [11, 13]


def nudged_copy(target: Path, path: Path) -> Path:
    """The target's weights, each matrix nudged by noise: as a draft its argmax is often not the
    target's, while the target's token is often among its next likeliest."""
    shutil.copytree(target, path)
    w = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    for k, t in w.items():
        if t.dim() == 2:
            w[k] = t + 0.15 * t.std() * torch.randn(t.shape, generator=g)
    save_file(w, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def near_draft(tiny_ckpts, tmp_path_factory) -> Path:
    return nudged_copy(tiny_ckpts["qwen3"], tmp_path_factory.mktemp("near") / "draft")


def _run_checked(s, prompts: list[list[int]], sp: SamplingParams) -> dict[int, list[int]]:
    for uid, p in enumerate(prompts):
        s.add_request(uid, p, sp)
    return _tokens(drain(s, every_step=True))


def test_a_draft_models_branches_keep_the_greedy_tokens_and_more_drafts(
        tiny_ckpts, near_draft, monkeypatch) -> None:
    path = tiny_ckpts["qwen3"]
    prompts = _prompts(300)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = _run_checked(_scheduler(path), prompts, sp)
    spec = {"speculative_algorithm": "draft", "speculative_draft_model_path": str(near_draft)}
    chain = _scheduler(path, **spec, speculative_num_draft_tokens=3)
    assert _run_checked(chain, prompts, sp) == plain
    kept_branch = []
    commit = verify_step.commit
    monkeypatch.setattr(verify_step, "commit", lambda s, req, step, walk, last: kept_branch.append(
        any(n >= len(step.tree.first_path()) for n in walk.nodes))
        or commit(s, req, step, walk, last))
    tree = _scheduler(path, **spec, **BRANCHED)
    assert _run_checked(tree, prompts, sp) == plain
    # some walks kept a branch (the chain's node indices come first), and with them the tree
    # kept more drafts than the chain of the same depth
    assert any(kept_branch)
    assert tree.stats()["spec_accepted_tokens"] > chain.stats()["spec_accepted_tokens"]
    assert tree.table.num_free == tree.table.max_reqs - 1  # every scratch row back


def test_sampled_requests_walk_the_branches_and_leak_nothing(tiny_ckpts, near_draft) -> None:
    s = _scheduler(tiny_ckpts["qwen3"], speculative_algorithm="draft",
                   speculative_draft_model_path=str(near_draft), **BRANCHED)
    sp = SamplingParams(temperature=0.8, top_k=5, max_tokens=20, ignore_eos=True, seed=3)
    got = _run_checked(s, _prompts(300), sp)
    assert {uid: len(t) for uid, t in got.items()} == {uid: 20 for uid in range(len(got))}
    assert s.stats()["spec_verify_steps"] > 0


def test_eagle3_branches_keep_the_greedy_tokens(tmp_path) -> None:
    from radixserve.testing import write_tiny_checkpoint
    from tests.runtime.test_eagle3 import _prompts as eagle_prompts
    from tests.runtime.test_eagle3 import write_eagle3

    target = write_tiny_checkpoint("qwen3", tmp_path / "t", seed=1, num_hidden_layers=4)
    head = write_eagle3(tmp_path / "head", target, layer_ids=[0, 1, 2])
    sp = SamplingParams(max_tokens=16, ignore_eos=True)
    plain = _run_checked(_scheduler(target), eagle_prompts(), sp)
    s = _scheduler(target, speculative_algorithm="eagle3", speculative_draft_model_path=str(head),
                   **BRANCHED)
    assert _run_checked(s, eagle_prompts(), sp) == plain
    assert s.stats()["spec_draft_tokens"] > 0


def test_flags_of_a_tree_of_draft_steps_are_checked() -> None:
    draft = {"speculative_algorithm": "draft", "speculative_draft_model_path": "x"}
    with pytest.raises(ValueError, match="n-gram trees take --speculative-ngram-max-bfs-breadth"):
        SchedulerConfig(speculative_algorithm="ngram", speculative_eagle_topk=2)
    with pytest.raises(ValueError, match="a path of the tree is at most all of its nodes"):
        SchedulerConfig(**draft, speculative_eagle_topk=2, speculative_num_steps=5,
                        speculative_num_draft_tokens=4)
    with pytest.raises(ValueError, match="leave it out or make them equal"):
        SchedulerConfig(**draft, speculative_num_steps=2, speculative_num_draft_tokens=4)
    cfg = SchedulerConfig(**draft, speculative_eagle_topk=4, speculative_num_steps=2,
                          speculative_num_draft_tokens=6)
    assert (cfg.speculative_depth, cfg.speculative_breadth) == (2, 4)
    assert SchedulerConfig(**draft).speculative_depth == 4  # the chain: num-draft-tokens deep
