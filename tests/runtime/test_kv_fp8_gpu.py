"""The FP8 KV cache through the whole engine on CUDA, every attention backend (the rotary kernel
quantizes k/v into the pool, the backends read it): the embedded SmolLM2 in bfloat16, its text's
perplexity within 2% of the bf16 cache's (as on CPU, `test_kv_fp8_accuracy.py`) and the
teacher-forced top-1 agreement at least 90% (CPU measured 94.6% against a float32 reference; the
margin is wider here, bf16 arithmetic adding its own near-tie flips; a broken scale gives ~1%);
CUDA graphs (scales captured as constants) change no Triton token."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.gpu.helpers import NEEDS_EMBEDDED

pytestmark = [pytest.mark.gpu, NEEDS_EMBEDDED]
_NO_FLASHINFER = pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                                    reason="flashinfer not installed")
SPECS = ["triton", pytest.param("flashinfer", marks=_NO_FLASHINFER),
         pytest.param("flashinfer,triton", marks=_NO_FLASHINFER)]
TEXT = Path(__file__).parents[1] / "data" / "fp8_eval_text.txt"
MIN_TOP1_BF16 = 0.90


@pytest.fixture(scope="module")
def text_ids() -> list[int]:
    from transformers import AutoTokenizer

    from radixserve.models.default_model import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(None)).encode(TEXT.read_text())


def _llm(kv: str, attn: str, graphs: int | None = None):
    from radixserve import LLM

    return LLM(dtype="bfloat16", device="cuda", kv_cache_dtype=kv, attn=attn, page_size=16,
               max_running_requests=32, cuda_graph_max_bs=graphs, max_kv_tokens=16384)


@pytest.mark.parametrize("attn", SPECS)
def test_fp8_perplexity_and_top1_close_to_bf16_cache(text_ids, attn: str) -> None:
    from radixserve.bench.kv_accuracy import teacher_forced, top1_agreement
    from tests.runtime.test_kv_fp8_accuracy import PPL_REL_TOL

    ref = teacher_forced(_llm("auto", attn).scheduler, text_ids)
    llm = _llm("fp8_e4m3", attn)
    assert llm.scheduler.engine.kv_pool.is_fp8
    got = teacher_forced(llm.scheduler, text_ids)
    assert abs(got.perplexity / ref.perplexity - 1) <= PPL_REL_TOL, (got.perplexity, ref.perplexity)
    assert top1_agreement(ref, got) >= MIN_TOP1_BF16


@pytest.mark.parametrize("attn", ["triton"])
def test_fp8_graphs_on_and_off_give_same_tokens(text_ids, attn: str) -> None:
    """Eight prompts, decode at batch 8 throughout (a captured size, no padding), where Triton
    decode is bit-identical with and without graphs (FlashInfer's replay is held to its eager
    output within tolerance in tests/attention/test_gpu_backends.py)."""
    from radixserve.bench.kv_accuracy import greedy_tokens, text_prompts

    prompts = [p[:40] for p in text_prompts(text_ids, 8)]
    runs = []
    for graphs in (8, 0):
        llm = _llm("fp8_e4m3", attn, graphs)
        assert (llm.scheduler.engine.graph_runner is not None) == bool(graphs)
        runs.append(greedy_tokens(llm, prompts, 24))
        llm.scheduler.check_integrity()
    assert runs[0] == runs[1]
