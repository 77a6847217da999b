"""Piecewise prefill CUDA graphs change how a prefill batch is launched, never what it computes:
the logits of a padded prefill equal the eager ones, and generation with them equals generation
without, prefill and mixed batches included."""
from __future__ import annotations

import pytest
import torch

from radixserve.engine.prefill_graph import PrefillGraphRunner
from tests.gpu.helpers import GRAPH_BACKENDS, generate, rel_err
from tests.runtime.helpers import prefill_logits, random_prompts

pytestmark = pytest.mark.gpu


def _engine(path, dtype: str, attn: str, **kw):
    from radixserve.config import EngineConfig
    from radixserve.engine.engine import Engine

    return Engine(EngineConfig(model=str(path), dtype=dtype, device="cuda", attn=attn,
                               page_size=16, **kw), max_running_requests=16,
                  max_prefill_length=512)


@pytest.mark.parametrize("attn", GRAPH_BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_padded_prefill_replay_gives_the_eager_logits(tiny_ckpts_hd64, arch, dtype, attn) -> None:
    """Prompts of 3-200 tokens in one batch of 423 tokens, replayed at 448: every position's
    logits against the same engine's eager forward (graphs off, fresh KV)."""
    prompts = random_prompts(5, [3, 200, 57, 120, 43], 300, seed=11)
    got = prefill_logits(_engine(tiny_ckpts_hd64[arch], dtype, attn), prompts)
    eager = _engine(tiny_ckpts_hd64[arch], dtype, attn, prefill_graph_max_tokens=0)
    assert eager.prefill_graphs is None
    want = prefill_logits(eager, prompts)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for g, w in zip(got, want):
        assert rel_err(g, w) <= tol


@pytest.mark.parametrize("attn", GRAPH_BACKENDS)
def test_generation_with_prefill_graphs_equals_without_fp32(tiny_ckpts_hd64, monkeypatch, attn) -> None:
    """Chunked prompts (a 700-token one over 256-token batches), mixed prefill+decode batches and
    plain decode: the same greedy tokens with prefill graphs as without, and the graphs ran."""
    replayed: list[int] = []
    run = PrefillGraphRunner.run

    def spy(self, batch):
        replayed.append(batch.num_tokens)
        return run(self, batch)

    monkeypatch.setattr(PrefillGraphRunner, "run", spy)
    prompts = random_prompts(9, [3, 700, 90, 17, 250, 41], 300, seed=12)
    max_tokens = [12, 5, 9, 20, 3, 7, 14, 6, 10]
    kw = {"dtype": "float32", "device": "cuda", "attn": attn, "page_size": 16,
          "max_running_requests": 4, "max_prefill_length": 256}
    on = generate(tiny_ckpts_hd64["qwen3"], prompts, max_tokens, **kw)
    assert replayed and max(replayed) <= 256
    n_on = len(replayed)
    off = generate(tiny_ckpts_hd64["qwen3"], prompts, max_tokens, prefill_graph_max_tokens=0, **kw)
    assert len(replayed) == n_on  # none with the graphs off
    assert [len(t) for t in on] == max_tokens
    assert on == off


def test_a_batch_past_the_captured_counts_runs_eagerly(tiny_ckpts_hd64) -> None:
    engine = _engine(tiny_ckpts_hd64["qwen3"], "bfloat16", "triton", prefill_graph_max_tokens=64)
    assert engine.prefill_graphs is not None and engine.prefill_graphs.sizes == [32, 64]
    prompts = random_prompts(2, [50, 40], 300, seed=13)  # 90 tokens: eager
    eager = _engine(tiny_ckpts_hd64["qwen3"], "bfloat16", "triton", prefill_graph_max_tokens=0)
    for g, w in zip(prefill_logits(engine, prompts), prefill_logits(eager, prompts)):
        assert torch.equal(g, w)
