"""Piecewise prefill graphs (`engine/prefill_graph.py`) on CPU: the pieces a CUDA graph captures,
run eagerly over the same padded static buffers, give the plain forward's hidden states and KV.
The captured graphs themselves are checked on the GPU (`tests/gpu/test_prefill_graphs.py`)."""
from __future__ import annotations

import pytest
import torch

from radixserve.core.batch import Batch
from radixserve.engine.prefill_graph import PrefillGraphRunner, prefill_token_counts
from tests.runtime.helpers import random_prompts


@pytest.mark.parametrize("max_tokens", [8192, 1000, 40, 32, 7])
def test_token_counts_cover_every_batch_with_at_most_an_eighth_padded(max_tokens: int) -> None:
    counts = prefill_token_counts(max_tokens)
    assert counts == sorted(set(counts)) and counts[-1] == max_tokens
    for t in range(1, max_tokens + 1):
        n = next(c for c in counts if c >= t)  # the count a batch of t tokens replays
        if t > 256:
            assert (n - t) * 8 <= t, (t, n)
    if max_tokens == 8192:
        assert len(counts) <= 48  # a bounded number of graphs to capture


def _engine(path, **kw):
    from radixserve.config import EngineConfig
    from radixserve.engine.engine import Engine

    return Engine(EngineConfig(model=str(path), dtype="float32", device="cpu", **kw),
                  max_running_requests=8)


def _batch(engine, prompts: list[list[int]], starts: list[int], rows: list[int]) -> Batch:
    """A prefill batch extending each request from `starts[i]` cached tokens; slots are the
    request's row times 256 plus its position (each request its own range)."""
    dev = engine.device
    ext = [len(p) - s for p, s in zip(prompts, starts)]
    pos = [torch.arange(s, len(p)) for p, s in zip(prompts, starts)]
    for r, p in zip(rows, prompts):
        engine.table.page_table[r, : len(p)] = torch.arange(len(p), dtype=torch.int32) + r * 256
    return Batch(
        "prefill", torch.tensor([t for p, s in zip(prompts, starts) for t in p[s:]], device=dev),
        torch.cat(pos).to(dev), torch.cat([x + r * 256 for x, r in zip(pos, rows)]).to(dev),
        torch.tensor(rows, device=dev), torch.tensor([len(p) for p in prompts], dtype=torch.int32),
        torch.tensor(ext, dtype=torch.int32), [len(p) for p in prompts], ext,
    )


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen3_moe"])
def test_pieces_over_padded_buffers_equal_the_plain_forward(tiny_ckpts, arch: str) -> None:
    """Three prompts prefilled in two batches (the second extends the first's cached KV), each
    padded up to a captured count: the runner's hidden states and the KV it wrote equal the plain
    forward's, and nothing but the scratch slot was written for the padding."""
    prompts = random_prompts(3, [29, 13, 40], 300, seed=3)
    cut = [11, 5, 17]  # tokens in the first batch
    results = {}
    for piecewise in (True, False):
        engine = _engine(tiny_ckpts[arch])
        runner = PrefillGraphRunner(engine.model.model, engine.attn_backend, 64,
                                    engine.kv_pool.dummy_slot, use_graphs=False)
        rows = [engine.table.alloc_row() for _ in prompts]
        engine.kv_pool.k_cache(0).fill_(7.0)  # any write outside the batch's slots shows
        hidden = []
        for starts, ends in (([0, 0, 0], cut), (cut, [len(p) for p in prompts])):
            batch = _batch(engine, [p[:e] for p, e in zip(prompts, ends)], starts, rows)
            assert batch.num_tokens not in runner.sizes  # so the runner pads it
            with torch.inference_mode():
                h = runner.run(batch) if piecewise else engine.forward_hidden(batch)
            hidden.append(h.clone())
        pool = engine.kv_pool
        k0 = pool.k_cache(0).clone()
        k0[pool.dummy_slot] = 7.0
        results[piecewise] = (hidden, k0, pool.v_cache(engine.model.model.num_pieces - 2).clone())
    (h_pw, k_pw, v_pw), (h_eager, k_eager, v_eager) = results[True], results[False]
    for got, want in zip(h_pw, h_eager):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_pw, k_eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_pw, v_eager, rtol=1e-5, atol=1e-5)


def test_off_on_cpu_and_a_negative_bound_is_refused(tiny_ckpts) -> None:
    from radixserve.config import EngineConfig

    assert _engine(tiny_ckpts["qwen3"]).prefill_graphs is None  # CUDA graphs need CUDA
    with pytest.raises(ValueError, match="prefill_graph_max_tokens"):
        EngineConfig(prefill_graph_max_tokens=-1)


def test_the_captured_bound_is_the_default_or_the_flag_within_the_prefill_chunk() -> None:
    from radixserve.engine.engine import DEFAULT_PREFILL_GRAPH_TOKENS, prefill_graph_tokens

    assert prefill_graph_tokens(None, 16384) == DEFAULT_PREFILL_GRAPH_TOKENS == 8192
    assert prefill_graph_tokens(None, 512) == 512  # batches never exceed the chunk
    assert prefill_graph_tokens(8192, 16384) == 8192
    assert prefill_graph_tokens(8192, 4096) == 4096
    assert prefill_graph_tokens(0, 8192) == 0  # off
