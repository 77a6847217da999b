"""Speculative decoding on CUDA: with decode CUDA graphs, prefill graphs and overlap scheduling
on, greedy tokens equal plain decoding's on the same device for each drafter, page size and
form of the verification step (decode rows, which replay the decode graphs, including the
verification graphs of the sizes where the Triton decode kernel would fuse the new token's KV
store; or an extend, which replays the prefill graphs); the target's own weights as draft keep
every draft; the books balance after each run."""
from __future__ import annotations

import gc

import pytest

from tests.runtime.helpers import drain, random_prompts

pytestmark = pytest.mark.gpu
MAX_NEW = 24
# repetitive prompts (n-gram matches to verify) beside random ones
PROMPTS = [[5, 6, 7, 8] * 8, [9, 10, 11] * 11, list(range(20, 52)) * 2,
           *random_prompts(5, [3, 17, 40, 90, 130], 300, seed=8)]


def _run(path, page_size: int, form: str = "decode", **spec) -> tuple[dict[int, list[int]], dict,
                                                                       list[tuple[str, int]]]:
    """Tokens, stats, and each verification batch's (graph kind it replayed, rows)."""
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.scheduler import Scheduler

    s = Scheduler(EngineConfig(model=str(path), dtype="float32", device="cuda", page_size=page_size,
                               attn="triton"),
                  SchedulerConfig(max_running_requests=16, **spec))
    eng = s.engine
    assert eng.graph_runner is not None and eng.prefill_graphs is not None
    if form == "extend":  # (where no decode graph takes the rows)
        eng.verifies_as_decode = lambda rows: False
    verifying, replays = [], []
    decode_run, prefill_run, rows = eng.graph_runner.run, eng.prefill_graphs.run, eng.forward_rows
    eng.graph_runner.run = lambda b: (b.verify and replays.append(("decode", b.bs))) or decode_run(b)
    eng.prefill_graphs.run = lambda b: (any(v is b for v in verifying) and replays.append(
        ("prefill", b.bs))) or prefill_run(b)
    eng.forward_rows = lambda batch, r: verifying.append(batch) or rows(batch, r)
    out, stats = _tokens_then_release(s)
    return out, stats, replays


def _tokens_then_release(s) -> tuple[dict[int, list[int]], dict]:
    """Each prompt's greedy tokens and the scheduler's stats, its books checked; its graphs and
    memory released."""
    from radixserve import SamplingParams

    for uid, p in enumerate(PROMPTS):
        s.add_request(uid, p, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    out = {uid: [o.token_id for o in outs] for uid, outs in drain(s).items()}
    s.check_integrity()
    stats = s.stats()
    s.engine.release_cuda_graphs()
    del s
    gc.collect()
    return out, stats


@pytest.mark.parametrize(("page_size", "form"), [(1, "decode"), (16, "decode"), (16, "extend")])
@pytest.mark.parametrize("algo", ["ngram", "draft"])
def test_greedy_tokens_on_cuda_equal_plain_decoding(tiny_ckpts, algo: str, page_size: int,
                                                    form: str) -> None:
    from radixserve.attention.triton_backend import TritonBackend

    path = tiny_ckpts["qwen3"]
    plain, _, _ = _run(path, page_size)
    spec = {"speculative_algorithm": algo}
    if algo == "draft":  # the target's own weights: every draft is kept
        spec["speculative_draft_model_path"] = str(path)
    got, stats, replays = _run(path, page_size, form, **spec)
    assert got == plain
    assert stats["spec_verify_steps"] > 0 and stats["spec_accepted_tokens"] > 0, stats
    kinds = {kind for kind, _ in replays}
    assert kinds == {"decode" if form == "decode" else "prefill"}, replays
    if form == "decode":  # (sizes where the fused store would race: their own graphs)
        assert any(n <= TritonBackend.ROPE_IN_DECODE_MAX_BS for _, n in replays), replays
    if algo == "draft":
        assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"], stats


@pytest.mark.parametrize(("page_size", "overlap"), [(1, True), (16, False)])
def test_eagle3_greedy_tokens_on_cuda_equal_plain_decoding(tmp_path, page_size: int,
                                                           overlap: bool) -> None:
    """EAGLE-3 on CUDA (the target runs eagerly: the hidden-state capture is not graphed), its
    head in the published format, against plain decoding with graphs on the same device."""
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.scheduler import Scheduler
    from radixserve.testing import write_tiny_checkpoint
    from tests.runtime.test_eagle3 import write_eagle3

    target = write_tiny_checkpoint("qwen3", tmp_path / "target", seed=1, num_hidden_layers=4)
    head = write_eagle3(tmp_path / "head", target, layer_ids=[0, 1, 2])

    def tokens(**spec) -> tuple[dict[int, list[int]], dict]:
        return _tokens_then_release(Scheduler(
            EngineConfig(model=str(target), dtype="float32", device="cuda", page_size=page_size),
            SchedulerConfig(max_running_requests=16, overlap=overlap, **spec)))

    plain, _ = tokens()
    got, stats = tokens(speculative_algorithm="eagle3", speculative_draft_model_path=str(head))
    assert got == plain
    assert stats["spec_verify_steps"] > 0 and stats["spec_draft_tokens"] > 0, stats


def test_ngram_trees_on_cuda_equal_plain_decoding(tiny_ckpts, monkeypatch) -> None:
    """Trees of n-gram matches (page size 1): each node a decode row through its scratch row,
    replayed by the decode graphs; greedy tokens equal plain decoding's, the books balance."""
    from radixserve.scheduler import verify_tree

    staged = []
    stage = verify_tree.stage
    monkeypatch.setattr(verify_tree, "stage",
                        lambda s, r, t: (step := stage(s, r, t)) and staged.append(step) or step)
    path = tiny_ckpts["qwen3"]
    plain, _, _ = _run(path, 1)
    got, stats, replays = _run(path, 1, speculative_algorithm="ngram",
                               speculative_ngram_max_bfs_breadth=3,
                               speculative_ngram_min_match_window_size=1)
    assert got == plain
    assert any(not st.tree.is_chain for st in staged), len(staged)
    assert replays and {kind for kind, _ in replays} == {"decode"}, replays
    assert stats["spec_accepted_tokens"] > 0, stats


def test_draft_model_branches_on_cuda_equal_plain_decoding(tiny_ckpts, tmp_path) -> None:
    """--speculative-eagle-topk: a nudged copy of the target drafts a chain and its next likeliest
    tokens as branches, verified as one tree through the decode graphs: greedy tokens equal plain
    decoding's, some drafts kept, the books balance."""
    from tests.runtime.test_draft_branches import BRANCHED, nudged_copy

    path = tiny_ckpts["qwen3"]
    plain, _, _ = _run(path, 1)
    got, stats, replays = _run(path, 1, speculative_algorithm="draft",
                               speculative_draft_model_path=str(nudged_copy(path, tmp_path / "d")),
                               **BRANCHED)
    assert got == plain
    assert replays and {kind for kind, _ in replays} == {"decode"}, replays
    assert stats["spec_accepted_tokens"] > 0, stats
