"""On CUDA in float32, the Triton backend serves sliding-window models: Mistral and Gemma 3 greedy
tokens equal transformers' with prompts and generations past the window, at page sizes 1 and 16,
with chunked prefill, CUDA graphs at their defaults (the window captured with each layer's decode
kernel), head sizes that take the decode kernel's fused new-token path (64) and not (16), and a
second pass served from the prefix cache; `--attn auto` serves them with Triton too."""
from __future__ import annotations

import gc
from pathlib import Path

import pytest

from tests.gpu.helpers import HAS_TRITON
from tests.runtime.helpers import hf_greedy, random_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")]
MAX_NEW = 40  # generations run past the window as well
HEAD_DIMS = (16, 64)


def _lengths() -> list[int]:
    from radixserve.testing import SLIDING_WINDOW

    return [1, 7, SLIDING_WINDOW - 1, SLIDING_WINDOW, SLIDING_WINDOW + 1, 60, 130, 300]


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    from radixserve.testing import WINDOWED_ARCHS, write_tiny_checkpoint

    root = tmp_path_factory.mktemp("windowed_gpu")
    return {(a, d): write_tiny_checkpoint(a, root / f"{a}-{d}", head_dim=d)
            for a in WINDOWED_ARCHS for d in HEAD_DIMS}


@pytest.fixture(scope="module")
def reference(windowed) -> dict[tuple[str, int], tuple[list[list[int]], list[list[int]]]]:
    out = {}
    for seed, (key, path) in enumerate(windowed.items()):
        prompts = random_prompts(len(_lengths()), _lengths(), 300, seed=40 + seed)
        out[key] = (prompts, hf_greedy(path, prompts, MAX_NEW, device="cuda"))
    return out


def _tokens(llm, prompts: list[list[int]]) -> list[list[int]]:
    from radixserve import SamplingParams

    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    return [r.token_ids for r in llm.generate(prompts, sp)]


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("page_size,max_prefill", [(1, 8192), (16, 32)])
def test_triton_greedy_matches_transformers_past_the_window(windowed, reference, arch, head_dim,
                                                            page_size, max_prefill):
    from radixserve import LLM

    prompts, expected = reference[(arch, head_dim)]
    llm = LLM(str(windowed[(arch, head_dim)]), dtype="float32", device="cuda", attn="triton",
              cache="radix", page_size=page_size, max_prefill_length=max_prefill,
              max_running_requests=8)
    sched = llm.scheduler
    assert sched.engine.attn_cfg.has_windows
    assert type(sched.engine.attn_backend).__name__ == "TritonBackend"
    assert sched.engine.graph_runner is not None, "graphs default on"
    assert _tokens(llm, prompts) == expected, f"{arch}: cold"
    hits = sched.stats()["prefix_hit_tokens"]
    assert _tokens(llm, prompts) == expected, f"{arch}: warm"
    assert sched.stats()["prefix_hit_tokens"] > hits
    sched.check_integrity()
    del llm, sched
    gc.collect()


def test_auto_serves_a_windowed_model_with_triton(windowed, reference) -> None:
    from radixserve import LLM

    key = ("gemma3", 64)
    prompts, expected = reference[key]
    llm = LLM(str(windowed[key]), dtype="float32", device="cuda", attn="auto",
              max_running_requests=8)
    assert type(llm.scheduler.engine.attn_backend).__name__ == "TritonBackend"
    assert _tokens(llm, prompts) == expected
