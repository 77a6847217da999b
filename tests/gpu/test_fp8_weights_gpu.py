"""FP8 weight checkpoints on CUDA in 16-bit: block-FP8 (128x128) and per-channel linear weights
stay FP8 and run the FP8-weight kernels (the Triton one-row, skinny and tiled ones; cuBLASLt's
block-scaled GEMM from two rows on Hopper), and the model follows
transformers on the dequantized checkpoint as closely as bf16 allows: prefill logits as close
to its float32 logits as transformers' own 16-bit run (`bf16_bound`), greedy tokens parting only at the reference's near-ties (decode steps
replayed from CUDA graphs); a wrong block scale is seen."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from radixserve.layers import fp8_linear
from radixserve_kernels import SKINNY_MAX_M, blockwise_fits
from radixserve_kernels._utils import fp8_blockwise_capable
from tests.gpu.helpers import (
    assert_greedy_parts_only_at_ties,
    bf16_bound,
    generate,
    hf_greedy_fp8_inputs,
    hf_logits,
    rel_err,
    sharpen_lm_head,
)
from tests.models.fp8_checkpoints import corrupt_scale, write_fp8_checkpoint
from tests.runtime.helpers import hf_greedy, prefill_logits, random_prompts

pytestmark = pytest.mark.gpu
REL_TOL = 2e-2
BLOCK = (128, 128)
WIDE_QWEN3 = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 2,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64}


@pytest.fixture(scope="module")
def fp8_qwen3(realistic_qwen3, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """format -> (FP8 checkpoint of the realistic Qwen3, its dequantized float32 twin)."""
    from radixserve.testing import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("fp8_gpu")
    out = {f: (write_fp8_checkpoint(realistic_qwen3, root / f, f, ref=root / f"{f}-ref",
                                    block=BLOCK), root / f"{f}-ref") for f in ("block", "channel")}
    # every K a multiple of 512 (4 column blocks): what cuBLASLt's block-scaled GEMM takes
    wide = sharpen_lm_head(write_tiny_checkpoint("qwen3", root / "wide", seed=1, **WIDE_QWEN3))
    out["block-wide"] = (write_fp8_checkpoint(wide, root / "block-wide", "block",
                                              ref=root / "block-wide-ref", block=BLOCK),
                         root / "block-wide-ref")
    return out


def _engine(path: Path, dtype: str):
    """Eager: a prefill graph would pad a batch to at least 32 tokens, past the FP8-weight
    kernel's 16 rows."""
    from radixserve.config import EngineConfig
    from radixserve.engine.engine import Engine

    return Engine(EngineConfig(model=str(path), dtype=dtype, device="cuda", page_size=16,
                               cuda_graph_max_bs=0, prefill_graph_max_tokens=0),
                  max_running_requests=4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt,lens", [("block", [5, 16, 37, 300]), ("channel", [3, 5, 8]),
                                      ("block-wide", [5, 16, 37, 300])])
def test_prefill_logits_follow_the_dequantized_checkpoint(fp8_qwen3, dtype, fmt, lens) -> None:
    """The per-channel batch holds 16 tokens, so its projections take the FP8-weight kernel (more
    rows quantize activations for `_scaled_mm`, a coarser product). The narrow block-FP8 model
    takes the Triton kernel (weight-only); the wide one, on Hopper, cuBLASLt's block-scaled GEMM,
    its activations rounded to e4m3 per row and 128 columns, which transformers' inputs then are
    too. Held to the dequantized model's float32 logits as closely as transformers' own 16-bit
    run of it comes: the kept FP8 weights are scaled in float32 inside the kernel, where
    transformers rounds each dequantized weight to 16 bits first."""
    path, ref = fp8_qwen3[fmt]
    engine = _engine(path, dtype)
    qkv = engine.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn
    assert qkv.scale_block_k == (None if fmt == "channel" else BLOCK[1])
    assert fmt != "channel" or sum(lens) <= SKINNY_MAX_M
    prompts = random_prompts(len(lens), lens, engine.hf_config.vocab_size, seed=2)
    x = torch.empty(1, qkv.weight.shape[1], device="cuda")
    fp8_inputs = fmt != "channel" and blockwise_fits(x, qkv.weight, qkv.weight_scale,
                                                     qkv.scale_block)
    capable = fp8_blockwise_capable(torch.cuda.current_device())
    assert fp8_inputs == (fmt == "block-wide" and capable)
    want = hf_logits(ref, prompts, torch.float32, "cuda", fp8_inputs)
    bound = bf16_bound(hf_logits(ref, prompts, getattr(torch, dtype), "cuda", fp8_inputs), want,
                       REL_TOL)
    for i, (got, w) in enumerate(zip(prefill_logits(engine, prompts), want)):
        assert rel_err(got, w) <= bound, f"prompt {i} ({lens[i]} tokens): {rel_err(got, w):.4f} > {bound:.4f}"


def test_a_wrong_block_scale_is_seen(fp8_qwen3, tmp_path) -> None:
    from transformers import AutoConfig

    path, ref = fp8_qwen3["block"]
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    corrupt_scale(bad, "model.layers.0.mlp.down_proj.weight_scale_inv", 4.0)
    prompts = random_prompts(2, [5, 40], AutoConfig.from_pretrained(ref).vocab_size, seed=4)
    want = hf_logits(ref, prompts, torch.bfloat16, "cuda")
    errs = [rel_err(g, w) for g, w in zip(prefill_logits(_engine(bad, "bfloat16"), prompts), want)]
    assert min(errs) > 5 * REL_TOL, errs


def test_block_fp8_greedy_parts_from_the_dequantized_model_only_at_ties(fp8_qwen3) -> None:
    """Batched decode through CUDA graphs (the one-row and skinny kernels), prefill through the
    tiled one. The reference is the dequantized model in float32: transformers' bf16 run of it
    rounds every weight to bf16, which the kept FP8 weights never are (as in the prefill test).
    A bf16 run whose logits are within B of the float32 ones (B as the prefill test bounds them,
    from transformers' own bf16 error on the same paths) can part from the float32 greedy choice
    only where its top two logits are within 2B: that is the tie tolerance."""
    from transformers import AutoConfig

    # the narrow model: weight-only kernels throughout, as the reference never rounds activations
    path, ref = fp8_qwen3["block"]
    vocab = AutoConfig.from_pretrained(ref).vocab_size
    prompts = random_prompts(24, [3, 17, 64, 150], vocab, seed=11)
    want = hf_greedy(ref, prompts, 16, torch.float32, "cuda")
    got = generate(path, prompts, 16, graphs=True, dtype="bfloat16", device="cuda", page_size=16,
                   max_running_requests=32)
    paths = [p + w[:-1] for p, w in zip(prompts, want)]
    exact = hf_logits(ref, paths, torch.float32, "cuda")
    bound = bf16_bound(hf_logits(ref, paths, torch.bfloat16, "cuda"), exact, REL_TOL / 2)
    assert_greedy_parts_only_at_ties(ref, prompts, got, want, 2 * bound, ref=exact)


def test_block_fp8_on_cublaslt_greedy_parts_only_at_ties(fp8_qwen3, monkeypatch) -> None:
    """The wide model on Hopper: prefill and batched decode (CUDA graphs, padded batches) through
    cuBLASLt's block-scaled GEMM, against transformers' float32 run of the dequantized model with
    its linear inputs rounded alike, ties allowed as in the test above. All 24 requests decode
    together to the end, so no step runs a single row (the one-row kernel rounds nothing)."""
    from transformers import AutoConfig

    if not fp8_blockwise_capable(torch.cuda.current_device()):
        pytest.skip("cuBLASLt's block-scaled FP8 GEMM is taken on Hopper only")
    path, ref = fp8_qwen3["block-wide"]
    vocab = AutoConfig.from_pretrained(ref).vocab_size
    prompts = random_prompts(24, [3, 17, 64, 150], vocab, seed=12)
    want = hf_greedy_fp8_inputs(ref, prompts, 16, torch.float32, "cuda")
    rows = []
    gemm = fp8_linear.blockwise_fp8_gemm
    monkeypatch.setattr(fp8_linear, "blockwise_fp8_gemm",
                        lambda x, *a: rows.append(x.shape[0]) or gemm(x, *a))
    got = generate(path, prompts, 16, graphs=True, dtype="bfloat16", device="cuda", page_size=16,
                   max_running_requests=32)
    assert any(2 <= r <= 32 for r in rows), sorted(set(rows))  # decode batches took it too
    paths = [p + w[:-1] for p, w in zip(prompts, want)]
    exact = hf_logits(ref, paths, torch.float32, "cuda", fp8_inputs=True)
    bound = bf16_bound(hf_logits(ref, paths, torch.bfloat16, "cuda", fp8_inputs=True), exact,
                       REL_TOL / 2)
    assert_greedy_parts_only_at_ties(ref, prompts, got, want, 2 * bound, ref=exact)
