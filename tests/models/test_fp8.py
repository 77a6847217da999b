"""FP8 weight checkpoints: a tiny Qwen3 quantized on the fly as Hugging Face block FP8 and as
compressed-tensors per-channel and per-tensor FP8 gives the logits of transformers loading the
same checkpoint, and greedy tokens of transformers on the dequantized weights; a wrong scale
changes them; the FP8 GEMM path keeps the checkpoint's bytes and scales, sharded per rank."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from radixserve import LLM, SamplingParams
from radixserve.models import loader
from radixserve.models.loader import load_model
from radixserve.testing import write_tiny_checkpoint
from tests.models.fp8_checkpoints import (
    BLOCK,
    FORMATS,
    corrupt_scale,
    dequantize,
    write_fp8_checkpoint,
)
from tests.models.helpers import hf_logits, our_logits
from tests.runtime.helpers import hf_greedy, random_prompts

IDS = random_prompts(1, [90], 300, seed=5)[0]


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """format -> (FP8 checkpoint, its dequantized float32 twin)."""
    root = tmp_path_factory.mktemp("fp8")
    src = write_tiny_checkpoint("qwen3", root / "src")
    return {f: (write_fp8_checkpoint(src, root / f, f, ref=root / f"{f}-ref"), root / f"{f}-ref")
            for f in FORMATS}


@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_match_transformers_on_the_dequantized_weights(fp8, fmt):
    path, ref = fp8[fmt]
    model, _ = load_model(path, torch.float32, "cpu")
    torch.testing.assert_close(our_logits(model, IDS), hf_logits(ref, IDS), atol=1e-4, rtol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_match_transformers_loading_the_same_fp8_checkpoint(fp8, fmt):
    """transformers' own FP8 loading on CPU: it dequantizes `fp8` checkpoints by itself, and
    compressed-tensors ones when asked to (`dequantize=True`; that needs `compressed-tensors`)."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    kw = {}
    if fmt != "block":
        pytest.importorskip("compressed_tensors", reason="transformers needs it for this format")
        kw["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    path, _ = fp8[fmt]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()
    assert hf.model.layers[0].mlp.down_proj.weight.dtype == torch.float32
    with torch.inference_mode():
        theirs = hf(torch.tensor([IDS])).logits[0].float()
    model, _ = load_model(path, torch.float32, "cpu")
    torch.testing.assert_close(our_logits(model, IDS), theirs, atol=1e-4, rtol=0)


GREEDY = [  # (format, cache, page size, max prefill, tp)
    ("block", "radix", 1, 16, 1),
    ("channel", "naive", 16, 8192, 1),
    ("tensor", "radix", 4, 32, 1),
    pytest.param("block", "radix", 4, 32, 2, marks=pytest.mark.slow),  # TP=2 over gloo
]


@pytest.mark.parametrize("fmt,cache,page,chunk,tp", GREEDY)
def test_greedy_tokens_equal_transformers(fp8, fmt, cache, page, chunk, tp):
    path, ref = fp8[fmt]
    prompts = random_prompts(4, [7, 40, 77, 130], 300, seed=3)
    expected = hf_greedy(ref, prompts, 10)
    llm = LLM(str(path), dtype="float32", device="cpu", cache=cache, page_size=page,
              max_prefill_length=chunk, tp=tp)
    try:
        sp = SamplingParams(max_tokens=10, ignore_eos=True)
        assert [r.token_ids for r in llm.generate(prompts, sp)] == expected
    finally:
        llm.close()


@pytest.mark.parametrize("fmt", ["block", "channel"])
def test_a_wrong_scale_changes_the_logits_and_tokens(fp8, tmp_path, fmt):
    path, ref = fp8[fmt]
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    suffix = "weight_scale_inv" if fmt == "block" else "weight_scale"
    corrupt_scale(bad, f"model.layers.0.mlp.down_proj.{suffix}", 4.0)
    model, _ = load_model(bad, torch.float32, "cpu")
    ours, want = our_logits(model, IDS), hf_logits(ref, IDS)
    assert (ours - want).abs().max() > 0.5
    assert (ours.argmax(-1) != want.argmax(-1)).any()


def test_block_scales_are_cut_with_their_rank_s_rows(fp8, tp_rank):
    """Rank 1 of 2: its K rows (16 of a 32-row block) are dequantized with that block's scales."""
    path, _ = fp8["block"]
    tensors = load_file(str(path / "model.safetensors"))
    tp_rank(1, 2)
    model, _ = load_model(path, torch.float32, "cpu")
    p = "model.layers.0.self_attn."
    q, k, v = (dequantize(tensors[p + f"{n}_proj.weight"], tensors[p + f"{n}_proj.weight_scale_inv"],
                          "block") for n in "qkv")
    assert BLOCK[0] == 32 and k.shape[0] == 32  # the rank's KV rows start mid-block
    want = torch.cat([q[32:64], k[16:32], v[16:32]])
    assert torch.equal(model.model.layers[0].self_attn.qkv_proj.weight, want)
    down = dequantize(tensors["model.layers.1.mlp.down_proj.weight"],
                      tensors["model.layers.1.mlp.down_proj.weight_scale_inv"], "block")
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, down[:, 64:])


@pytest.mark.parametrize("fmt", ["channel", "tensor"])
def test_fp8_gemm_path_keeps_checkpoint_bytes_and_row_scales(fp8, tp_rank, monkeypatch, fmt):
    """The GPU path (forced here: torch's `_scaled_mm` also runs on CPU): rank 1 of 2 stores
    its FP8 rows as the checkpoint has them, one scale per row (q, k and v each their own)."""
    path, _ = fp8[fmt]
    tensors = load_file(str(path / "model.safetensors"))
    monkeypatch.setattr(loader, "use_fp8_gemm", lambda device, dtype: True)
    tp_rank(1, 2)
    model, _ = load_model(path, torch.float32, "cpu")
    p = "model.layers.0.self_attn."
    qkv = model.model.layers[0].self_attn.qkv_proj
    w = {n: tensors[p + f"{n}_proj.weight"] for n in "qkv"}
    s = {n: tensors[p + f"{n}_proj.weight_scale"].reshape(-1).expand(w[n].shape[0]) for n in "qkv"}
    assert qkv.weight.dtype == torch.float8_e4m3fn
    want_w = torch.cat([w["q"][32:64], w["k"][16:32], w["v"][16:32]])
    assert torch.equal(qkv.weight.view(torch.uint8), want_w.view(torch.uint8))
    assert torch.equal(qkv.weight_scale, torch.cat([s["q"][32:64], s["k"][16:32], s["v"][16:32]]))
    o = model.model.layers[0].self_attn.o_proj  # row-parallel: input columns split, scales whole
    assert torch.equal(o.weight.view(torch.uint8),
                       tensors[p + "o_proj.weight"][:, 32:].view(torch.uint8))
    assert torch.equal(o.weight_scale, tensors[p + "o_proj.weight_scale"].reshape(-1).expand(64))


@pytest.mark.parametrize("fmt", ["channel", "tensor"])
def test_fp8_gemm_path_stays_close_to_transformers(fp8, monkeypatch, fmt):
    """With activations quantized per token, logits stay within FP8's error and greedy picks
    mostly agree (they need not all: FP8 activations are not what the reference computes)."""
    path, ref = fp8[fmt]
    monkeypatch.setattr(loader, "use_fp8_gemm", lambda device, dtype: True)
    model, _ = load_model(path, torch.float32, "cpu")
    assert model.model.layers[1].mlp.gate_up_proj.weight.dtype == torch.float8_e4m3fn
    ours, want = our_logits(model, IDS), hf_logits(ref, IDS)
    err = (ours - want).abs().mean() / want.abs().mean()
    assert err < 0.15  # e4m3 keeps 3 mantissa bits (~3% a rounding); 8% measured here
    assert (ours.argmax(-1) == want.argmax(-1)).float().mean() > 0.75  # 88-91% measured


def _row_blocks(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """Block scales [rows / bm, cols / bk] repeated over each block's rows: [rows, cols / bk]."""
    return scale.repeat_interleave(BLOCK[0], 0)[:rows]


def test_block_fp8_gemm_path_keeps_checkpoint_bytes_and_block_scales(fp8, tp_rank, monkeypatch):
    """The GPU path for block scales (forced here): rank 1 of 2 stores its FP8 rows as the
    checkpoint has them and each row's block scales, wherever its rows start in a block (k and
    v: mid-block); the row-parallel o_proj takes its own columns of scales."""
    path, _ = fp8["block"]
    tensors = load_file(str(path / "model.safetensors"))
    monkeypatch.setattr(loader, "use_fp8_gemm", lambda device, dtype: True)
    tp_rank(1, 2)
    model, _ = load_model(path, torch.float32, "cpu")
    p = "model.layers.0.self_attn."
    qkv = model.model.layers[0].self_attn.qkv_proj
    w = {n: tensors[p + f"{n}_proj.weight"] for n in "qkv"}
    s = {n: _row_blocks(tensors[p + f"{n}_proj.weight_scale_inv"], w[n].shape[0]) for n in "qkv"}
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.scale_block_k == BLOCK[1]
    want_w = torch.cat([w["q"][32:64], w["k"][16:32], w["v"][16:32]])
    assert torch.equal(qkv.weight.view(torch.uint8), want_w.view(torch.uint8))
    # once loaded, the scales are kept one row per aligned group of rows that share them: the
    # rank's q rows are one 32-row block, its k and v rows half a block each, so groups of 16
    assert qkv.scale_block_n == 16 and qkv.weight_scale.shape == (4, 64 // BLOCK[1])
    assert torch.equal(_per_row(qkv), torch.cat([s["q"][32:64], s["k"][16:32], s["v"][16:32]]))
    o = model.model.layers[0].self_attn.o_proj
    assert torch.equal(o.weight.view(torch.uint8),
                       tensors[p + "o_proj.weight"][:, 32:].view(torch.uint8))
    o_scale = _row_blocks(tensors[p + "o_proj.weight_scale_inv"], 64)
    assert o.scale_block_n == BLOCK[0] and o.weight_scale.shape == (2, 32 // BLOCK[1])
    assert torch.equal(_per_row(o), o_scale[:, 32 // BLOCK[1]:])


def _per_row(layer: torch.nn.Module) -> torch.Tensor:
    """A layer's block scales repeated over the rows each covers: [rows, cols / bk]."""
    return layer.weight_scale.repeat_interleave(layer.scale_block_n, 0)[:layer.weight.shape[0]]


@pytest.mark.parametrize("corrupt", [False, True])
def test_block_fp8_gemm_path_gives_the_dequantized_logits(fp8, tmp_path, monkeypatch, corrupt):
    """Weight-only: the kept FP8 weights times their scales, activations unrounded, are
    transformers' logits on the dequantized checkpoint (float32 here, so to 1e-4); one block
    scale wrong, they are not."""
    path, ref = fp8["block"]
    if corrupt:
        shutil.copytree(path, tmp_path / "bad")
        path = tmp_path / "bad"
        corrupt_scale(path, "model.layers.1.self_attn.o_proj.weight_scale_inv", 3.0)
    monkeypatch.setattr(loader, "use_fp8_gemm", lambda device, dtype: True)
    model, _ = load_model(path, torch.float32, "cpu")
    assert model.model.layers[1].self_attn.o_proj.weight.dtype == torch.float8_e4m3fn
    ours, want = our_logits(model, IDS), hf_logits(ref, IDS)
    if corrupt:
        assert (ours - want).abs().max() > 0.1
    else:
        torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kept", [False, True])
def test_static_activation_scales_are_read_and_left_unused(fp8, tmp_path, monkeypatch, caplog,
                                                           kept):
    """A Hugging Face fp8 checkpoint with `activation_scheme: static` and an `input_scale` per
    linear weight loads (no tensor reported ignored) and gives the dequantized model's logits:
    weight-only dequantization never rounds activations to a static scale."""
    import json
    import logging

    from safetensors.torch import save_file

    path, ref = fp8["block"]
    static = tmp_path / "static"
    shutil.copytree(path, static)
    tensors = load_file(str(static / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(".weight_scale_inv")]:
        tensors[name.removesuffix("weight_scale_inv") + "input_scale"] = torch.tensor([0.02])
    save_file(tensors, str(static / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((static / "config.json").read_text())
    cfg["quantization_config"]["activation_scheme"] = "static"
    (static / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(loader, "use_fp8_gemm", lambda device, dtype: kept)
    with caplog.at_level(logging.INFO):
        model, _ = load_model(static, torch.float32, "cpu")
    assert "ignored" not in caplog.text
    down = model.model.layers[0].mlp.down_proj
    assert (down.weight.dtype == torch.float8_e4m3fn) == kept
    torch.testing.assert_close(our_logits(model, IDS), hf_logits(ref, IDS), atol=1e-4, rtol=0)


def test_dummy_block_fp8_weights(tmp_path, monkeypatch):
    """`load_format="dummy"` with a block-FP8 config, where FP8 weights are kept: every linear
    layer FP8 with positive scales, one a 128x128 block as a checkpoint's (so the layers keep one
    row of scales a block), logits of a usable spread."""
    from radixserve.bench.presets import fp8_block_dir

    src = write_tiny_checkpoint("qwen3", tmp_path / "src")
    monkeypatch.setattr(loader, "use_fp8_gemm", lambda device, dtype: True)
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    model, cfg = load_model(fp8_block_dir(src), torch.float32, "cpu", load_format="dummy")
    assert cfg.quantization_config["weight_block_size"] == [128, 128]
    layer = model.model.layers[1]
    for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                layer.mlp.down_proj):
        rows, cols = lin.weight.shape
        assert lin.weight.dtype == torch.float8_e4m3fn and lin.scale_block_k == 128
        assert lin.scale_block_n == 128 and (lin.weight_scale > 0).all()
        assert lin.weight_scale.shape == (-(-rows // 128), -(-cols // 128))
    logits = our_logits(model, IDS)
    assert logits.isfinite().all() and logits.std() > 0.1


def test_fp8_linear_is_the_product_of_the_quantized_operands():
    """`fp8_linear` = (each row of x rounded to FP8 with its scale) @ (FP8 weight * row scale).T,
    as computed from the operands in float64 (plus the bias)."""
    from radixserve.layers.fp8_linear import FP8_DTYPE, fp8_linear

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 32, generator=g), torch.randn(48, 32, generator=g), torch.randn(48)
    w_scale = w.abs().amax(dim=1) / 448
    wq = (w / w_scale[:, None]).to(FP8_DTYPE)
    x_scale = x.abs().amax(dim=1, keepdim=True) / 448
    xq = (x / x_scale).to(FP8_DTYPE)
    want = (xq.double() * x_scale.double()) @ (wq.double() * w_scale.double()[:, None]).T + b
    got = fp8_linear(x, wq, w_scale, b)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)
    assert (got - x @ w.T - b).abs().max() > 1e-3  # the operands really were rounded to FP8


def test_block_fp8_moe_experts_match_transformers(tmp_path):
    """A Qwen3-MoE whose experts are block FP8 too (as Qwen3-30B-A3B-FP8): the experts' fused
    weights are dequantized shard by shard like any linear weight."""
    src = write_tiny_checkpoint("qwen3_moe", tmp_path / "src")
    path = write_fp8_checkpoint(src, tmp_path / "fp8", "block", ref=tmp_path / "ref")
    assert "model.layers.0.mlp.experts.3.up_proj.weight_scale_inv" in load_file(
        str(path / "model.safetensors"))
    model, _ = load_model(path, torch.float32, "cpu")
    torch.testing.assert_close(our_logits(model, IDS), hf_logits(tmp_path / "ref", IDS),
                               atol=1e-4, rtol=0)
