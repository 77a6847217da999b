"""Greedy tokens equal transformers `generate` for every architecture and every cache, page size
and chunking configuration; a warm prefix cache changes nothing."""
from __future__ import annotations

import itertools

import pytest

from radixserve import LLM, SamplingParams
from tests.runtime.helpers import fast_corners, greedy_reference, random_prompts

LENGTHS = [1, 7, 16, 33, 64, 129, 200, 300]
MAX_NEW = 12
COMBOS = list(itertools.product(["radix", "naive"], [1, 16], [16, 8192]))


@pytest.fixture(scope="module")
def reference(tiny_ckpts):
    return greedy_reference(tiny_ckpts, LENGTHS, MAX_NEW)


@pytest.mark.parametrize("cache,page_size,max_prefill",
                         fast_corners(COMBOS, {("radix", 16, 16), ("naive", 1, 8192)}))
def test_greedy_parity_all_architectures(tiny_ckpts, reference, cache, page_size, max_prefill):
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    for arch, path in tiny_ckpts.items():
        prompts, expected = reference[arch]
        llm = LLM(str(path), dtype="float32", device="cpu", cache=cache, page_size=page_size,
                  max_prefill_length=max_prefill, max_running_requests=8)
        got = [r.token_ids for r in llm.generate(prompts, sp)]
        assert got == expected, f"{arch}: tokens differ from transformers"
        llm.scheduler.check_integrity()
        assert llm.scheduler.stats()["running"] == 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_warm_prefix_cache_gives_cold_tokens(tiny_ckpts, page_size):
    path = tiny_ckpts["qwen3"]
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    base = random_prompts(4, [150, 200, 64, 97], 300, seed=1)
    tails = random_prompts(4, [5, 40, 1, 17], 300, seed=2)
    second = [b + t for b, t in zip(base, tails)] + [base[0][:100]]
    warm = LLM(str(path), dtype="float32", device="cpu", cache="radix", page_size=page_size)
    warm.generate(base, sp)
    hits_before = warm.scheduler.stats()["prefix_hit_tokens"]
    warm_out = [r.token_ids for r in warm.generate(second, sp)]
    assert warm.scheduler.stats()["prefix_hit_tokens"] - hits_before >= 300
    cold = LLM(str(path), dtype="float32", device="cpu", cache="naive", page_size=page_size)
    assert warm_out == [r.token_ids for r in cold.generate(second, sp)]
    warm.scheduler.check_integrity()
