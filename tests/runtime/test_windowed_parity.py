"""Sliding-window models through the engine (torch backend): greedy tokens equal transformers'
for Mistral and Gemma 3 with prompts and generations past the window, for both prefix caches, a
page size, chunked prefill and TP=2; a warm radix cache gives the cold tokens (a cached prefix
holds every layer's KV); a window as long as the context is full attention. The Triton backend
too, its kernels in Triton's interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve import LLM, SamplingParams
from radixserve.testing import SLIDING_WINDOW, WINDOWED_ARCHS, write_tiny_checkpoint
from tests.kernels.kernel_cases import interpreter_only
from tests.runtime.helpers import hf_greedy, random_prompts

LENGTHS = [1, 7, SLIDING_WINDOW - 1, SLIDING_WINDOW, SLIDING_WINDOW + 1, 60, 130]
MAX_NEW = 12
SP = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
KW = {"dtype": "float32", "device": "cpu", "max_running_requests": 8}


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("windowed")
    return {a: write_tiny_checkpoint(a, root / a) for a in WINDOWED_ARCHS}


@pytest.fixture(scope="module")
def reference(windowed) -> dict[str, tuple[list[list[int]], list[list[int]]]]:
    out = {}
    for seed, (arch, path) in enumerate(windowed.items()):
        prompts = random_prompts(len(LENGTHS), LENGTHS, 300, seed=20 + seed)
        out[arch] = (prompts, hf_greedy(path, prompts, MAX_NEW))
    return out


def _tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [r.token_ids for r in llm.generate(prompts, SP)]


@pytest.mark.parametrize("arch", WINDOWED_ARCHS)
@pytest.mark.parametrize("cache,page_size,max_prefill,more", [
    ("radix", 1, 8192, {}),
    ("naive", 16, 16, {}),
    ("radix", 4, 32, {"overlap": False, "mixed_chunk": False}),
])
def test_greedy_parity_past_the_window(windowed, reference, arch, cache, page_size, max_prefill,
                                       more):
    prompts, expected = reference[arch]
    llm = LLM(str(windowed[arch]), cache=cache, page_size=page_size,
              max_prefill_length=max_prefill, **KW, **more)
    assert llm.scheduler.engine.attn_cfg.has_windows
    assert _tokens(llm, prompts) == expected, f"{arch}: tokens differ from transformers"
    llm.scheduler.check_integrity()


def test_warm_radix_cache_gives_transformers_tokens(windowed, reference):
    """Prompts that extend cached ones past the window: the cached prefix's KV serves both the
    global layer (all of it) and the local ones (its last window)."""
    prompts, _ = reference["gemma3"]
    longer = [p + q for p, q in zip(prompts[-3:], random_prompts(3, [5, 40, 30], 300, seed=9))]
    llm = LLM(str(windowed["gemma3"]), cache="radix", page_size=4, **KW)
    _tokens(llm, prompts)
    hits = llm.scheduler.stats()["prefix_hit_tokens"]
    assert _tokens(llm, longer) == hf_greedy(windowed["gemma3"], longer, MAX_NEW)
    assert llm.scheduler.stats()["prefix_hit_tokens"] - hits >= 100
    llm.scheduler.check_integrity()


@pytest.mark.slow
def test_tp2_gives_transformers_tokens(windowed, reference):
    prompts, expected = reference["gemma3"]
    llm = LLM(str(windowed["gemma3"]), tp=2, cache="radix", page_size=4, max_prefill_length=32,
              **KW)
    try:
        assert _tokens(llm, prompts) == expected
    finally:
        llm.close()


def test_window_as_long_as_the_context_is_full_attention(tmp_path):
    path = write_tiny_checkpoint("mistral", tmp_path / "m", sliding_window=4096)  # context 1024
    prompts = random_prompts(3, [7, 60, 130], 300, seed=4)
    llm = LLM(str(path), **KW)
    assert llm.scheduler.engine.attn_cfg.windows == ()
    assert _tokens(llm, prompts) == hf_greedy(path, prompts, MAX_NEW)


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
@interpreter_only
@pytest.mark.parametrize("arch,head_dim", [("mistral", 16), ("gemma3", 32)])
def test_triton_backend_gives_transformers_tokens(tmp_path, monkeypatch, arch, head_dim):
    """The Triton backend's windowed kernels (in Triton's interpreter) through the engine, with
    prompts and generations past the window: head_dim 32 takes the decode kernel that rotates
    and stores the new token itself (Gemma 3's q/k norms too), 16 the rotary kernel's way."""
    from radixserve.attention import factory

    # the factory keeps Triton off CPU for serving; the interpreter runs its kernels there
    monkeypatch.setattr(factory, "check_backend", lambda name, device_type: None)
    path = write_tiny_checkpoint(arch, tmp_path / arch, head_dim=head_dim)
    prompts = random_prompts(2, [SLIDING_WINDOW + 1, 40], 300, seed=6)
    llm = LLM(str(path), attn="triton", cache="radix", page_size=4, **KW)
    assert type(llm.scheduler.engine.attn_backend).__name__ == "TritonBackend"
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    assert [r.token_ids for r in llm.generate(prompts, sp)] == hf_greedy(path, prompts, 8)
    llm.scheduler.check_integrity()
