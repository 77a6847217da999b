"""CUDA graphs and overlap scheduling change how batches run, never which tokens come out.

Graphs: decode replays padded up to a captured size must give the eager tokens. In float32 with
ragged batches (padding on most steps); in bfloat16 with a batch that is always exactly a
captured size, where Triton decode is bit-identical with and without graphs (its split count
depends on the padded size's power of two, and every power of two is captured).

Overlap: on the GPU the next batch really runs while the host reads the last one, so the two
upstream overlap bugs are checked here: `max_tokens` counted exactly (no extra token from the
batch in flight), and rows of finished requests not reused while that batch still writes them
(more short requests than `max_running_requests`). Compared in float32, since overlap lets a
finished request ride along in the next batch, which changes batch sizes."""
from __future__ import annotations

import importlib

import pytest

from tests.gpu.helpers import GRAPH_BACKENDS, generate
from tests.runtime.helpers import random_prompts

pytestmark = pytest.mark.gpu
MOE = "qwen3_moe"  # the architecture with the most kernels inside the graph


@pytest.mark.parametrize("attn", GRAPH_BACKENDS)
def test_graphs_on_and_off_give_same_tokens_fp32_padded(tiny_ckpts, attn) -> None:
    prompts = random_prompts(11, [3, 50, 9, 120, 1, 33], 300, seed=5)
    max_tokens = [20, 3, 9, 14, 1, 20, 6, 17, 2, 11, 8]  # decode sizes 11 down to 1: padded
    runs = [
        generate(tiny_ckpts[MOE], prompts, max_tokens, dtype="float32", device="cuda",
                 graphs=bs != 0, attn=attn, page_size=16, max_running_requests=16,
                 cuda_graph_max_bs=bs)
        for bs in (None, 0)
    ]
    assert [len(t) for t in runs[0]] == max_tokens
    assert runs[0] == runs[1]


def test_graphs_on_and_off_bit_identical_bf16_triton(tiny_ckpts) -> None:
    prompts = random_prompts(8, [40], 300, seed=6)  # one prefill, then decode at bs 8 throughout
    runs = [
        generate(tiny_ckpts[MOE], prompts, 24, dtype="bfloat16", device="cuda", graphs=bs != 0,
                 attn="triton", page_size=16, max_running_requests=8, cuda_graph_max_bs=bs)
        for bs in (8, 0)
    ]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_longest_first_launch_changes_no_token_bf16(tiny_ckpts, monkeypatch, kv: str) -> None:
    """From 64 requests Triton decode launches the longest request first (`decode_order_cpu`): the
    tokens equal those of batch order bit for bit, with graphs and without (one prefill, then
    decode at batch 64 throughout; mixed prompt lengths, so the order is not the batch's)."""
    import radixserve_kernels

    prompts = random_prompts(64, [20, 47, 33, 60, 25], 300, seed=7)
    kw = {"dtype": "bfloat16", "device": "cuda", "attn": "triton", "page_size": 16,
          "max_running_requests": 64, "kv_cache_dtype": kv}
    graphs = generate(tiny_ckpts[MOE], prompts, 16, graphs=True, cuda_graph_max_bs=64, **kw)
    eager = generate(tiny_ckpts[MOE], prompts, 16, graphs=False, cuda_graph_max_bs=0, **kw)
    monkeypatch.setattr(radixserve_kernels, "decode_order_cpu", lambda seq_lens: None)
    batch_order = generate(tiny_ckpts[MOE], prompts, 16, graphs=False, cuda_graph_max_bs=0, **kw)
    assert graphs == eager == batch_order


@pytest.mark.parametrize("n", [160, 256])
def test_fp8_key_dots_under_graph_replay_bit_identical(tiny_ckpts_hd64, monkeypatch, n: int) -> None:
    """From 128 requests over an FP8 cache, Triton decode's QK dots read the keys as they are
    (`FP8_QK_SHAPES`, bf16 q, head_dim 64): replayed in CUDA graphs they give the eager tokens bit
    for bit. Two prefill batches of mixed prompt lengths, then decode at exactly `n` requests (a
    captured size) throughout; both runs must have launched the FP8-key shapes."""
    # (the package's `decode_attention` attribute is the function, so the module by its name)
    da = importlib.import_module("radixserve_kernels.decode_attention")
    used: list[bool] = []
    config = da.decode_block_config

    def spy(*args, **kwargs):
        shape = config(*args, **kwargs)
        used.append(shape.fp8_qk)
        return shape

    monkeypatch.setattr(da, "decode_block_config", spy)
    prompts = random_prompts(n, [20, 47, 33, 60, 25, 51], 300, seed=8)
    kw = {"dtype": "bfloat16", "device": "cuda", "attn": "triton", "page_size": 16,
          "max_running_requests": n, "kv_cache_dtype": "fp8_e4m3", "max_prefill_length": 4096}
    graphs = generate(tiny_ckpts_hd64[MOE], prompts, 12, graphs=True, cuda_graph_max_bs=n, **kw)
    assert any(used), "the graphs never launched the FP8-key shapes"
    used.clear()
    eager = generate(tiny_ckpts_hd64[MOE], prompts, 12, graphs=False, cuda_graph_max_bs=0, **kw)
    assert any(used), "the eager run never launched the FP8-key shapes"
    assert [len(t) for t in graphs] == [12] * n
    assert graphs == eager


def test_engine_captures_graphs_only_when_asked(tiny_ckpts) -> None:
    from radixserve.config import EngineConfig
    from radixserve.engine.engine import Engine

    path = str(tiny_ckpts["llama"])
    on = Engine(EngineConfig(model=path, device="cuda", attn="triton"), max_running_requests=8)
    assert on.graph_runner is not None and sorted(on.graph_runner.graphs[(False, False)]) == [1, 2, 4, 8]
    assert list(on.graph_runner.graphs) == [(False, False)]  # no adapters, no verification
    off = Engine(EngineConfig(model=path, device="cuda", attn="triton", cuda_graph_max_bs=0),
                 max_running_requests=8)
    assert off.graph_runner is None


def _scheduler(path, overlap: bool, attn: str, **sched):
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.scheduler import Scheduler

    eng = EngineConfig(model=str(path), dtype="float32", device="cuda", page_size=4, attn=attn)
    return Scheduler(eng, SchedulerConfig(**{"max_running_requests": 4, "overlap": overlap, **sched}))


def _drain(s, prompts, max_tokens) -> dict[int, list]:
    from radixserve.sampling_params import SamplingParams

    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        s.add_request(i, p, SamplingParams(max_tokens=m, ignore_eos=True))
    out: dict[int, list] = {}
    for _ in range(20_000):
        if not s.has_work:
            s.check_integrity()
            st = s.stats()
            assert st["running"] == st["waiting"] == st["protected_tokens"] == 0
            return out
        for o in s.step():
            out.setdefault(o.uid, []).append(o)
    raise AssertionError("scheduler did not drain")


@pytest.mark.parametrize("attn", GRAPH_BACKENDS)
def test_overlap_counts_max_tokens_exactly(tiny_ckpts, attn) -> None:
    prompts = random_prompts(10, [3, 50, 9, 120, 1, 33], 300, seed=3)
    max_tokens = [1, 2, 7, 3, 11, 5, 1, 9, 4, 6]
    tokens = {}
    for overlap in (True, False):
        out = _drain(_scheduler(tiny_ckpts["llama3"], overlap, attn, max_prefill_length=48),
                     prompts, max_tokens)
        assert sorted(out) == list(range(len(prompts)))
        for uid, outs in out.items():
            assert len(outs) == max_tokens[uid], f"overlap={overlap}: request {uid} count off"
            assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
            assert outs[-1].finish_reason == "length"
        tokens[overlap] = {u: [o.token_id for o in outs] for u, outs in out.items()}
    assert tokens[True] == tokens[False]


@pytest.mark.parametrize("attn", GRAPH_BACKENDS)
def test_overlap_reusing_rows_gives_same_tokens(tiny_ckpts, attn) -> None:
    # 48 short requests through 4 rows: rows and KV pages of finished requests are handed to new
    # ones while the batch that last wrote them may still be running
    prompts = random_prompts(48, [1, 4, 9, 2, 13, 6], 300, seed=8)
    max_tokens = [1 + (i * 7) % 5 for i in range(48)]
    tokens = {}
    for overlap in (True, False):
        out = _drain(_scheduler(tiny_ckpts["qwen3"], overlap, attn), prompts, max_tokens)
        assert {u: len(o) for u, o in out.items()} == dict(enumerate(max_tokens))
        tokens[overlap] = {u: [o.token_id for o in outs] for u, outs in out.items()}
    assert tokens[True] == tokens[False]


def test_async_calls_replay_the_graphs_from_the_engine_thread(tiny_ckpts) -> None:
    """`agenerate` steps on the LLM's background thread (its own current device): the graphs
    captured on the main thread replay there and give `generate`'s tokens (float32)."""
    import asyncio

    from radixserve import LLM, SamplingParams

    prompts = random_prompts(6, [3, 50, 9], 300, seed=21)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    llm = LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cuda", attn="triton",
              page_size=16, max_running_requests=8)
    try:
        assert llm.scheduler.engine.graph_runner is not None
        want = [r.token_ids for r in llm.generate(prompts, sp)]

        async def run() -> list:
            return await asyncio.gather(*[llm.agenerate(p, sp) for p in prompts])

        assert [r[0].token_ids for r in asyncio.run(run())] == want
    finally:
        llm.close()
