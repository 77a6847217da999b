"""On CUDA in float32, greedy tokens equal transformers' for every architecture, every attention
backend, page sizes 1 and 16 and chunked prefill 16 and 8192, with the radix cache, CUDA graphs
and overlap scheduling at their defaults; a second pass over the same prompts (served from the
prefix cache) gives the same tokens again.

FlashInfer has no float32 kernels: for a float32 model its backend runs the Triton kernels, so
here `flashinfer` checks that fallback (and its graph hooks); its own kernels are checked in
bfloat16 (test_bf16.py)."""
from __future__ import annotations

import gc

import pytest

from tests.gpu.helpers import BACKENDS
from tests.runtime.helpers import greedy_reference

pytestmark = pytest.mark.gpu
LENGTHS = [1, 7, 16, 33, 64, 129, 200, 300]
MAX_NEW = 12
COMBOS = [(1, 16), (1, 8192), (16, 16), (16, 8192)]


@pytest.fixture(scope="module")
def reference(tiny_ckpts):
    return greedy_reference(tiny_ckpts, LENGTHS, MAX_NEW)


@pytest.mark.parametrize("attn", BACKENDS)
@pytest.mark.parametrize("page_size,max_prefill", COMBOS)
def test_fp32_greedy_matches_transformers(tiny_ckpts, reference, attn, page_size, max_prefill):
    from radixserve import LLM, SamplingParams

    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    for arch, path in tiny_ckpts.items():
        prompts, expected = reference[arch]
        llm = LLM(str(path), dtype="float32", device="cuda", attn=attn, cache="radix",
                  page_size=page_size, max_prefill_length=max_prefill, max_running_requests=8)
        sched = llm.scheduler
        assert (sched.engine.graph_runner is not None) == (attn != "torch"), "graphs default on"
        assert [r.token_ids for r in llm.generate(prompts, sp)] == expected, f"{arch}: cold"
        hits = sched.stats()["prefix_hit_tokens"]
        assert [r.token_ids for r in llm.generate(prompts, sp)] == expected, f"{arch}: warm"
        # every prompt but its last token comes from the cache, in whole pages
        cached = sum((n - 1) // page_size * page_size for n in LENGTHS)
        assert sched.stats()["prefix_hit_tokens"] - hits == cached
        sched.check_integrity()
        assert sched.stats()["running"] == 0
        del llm, sched
        gc.collect()
