"""Quantize a tiny float checkpoint to FP8 on the fly, in the layouts real checkpoints use:
Hugging Face `fp8` (block scales in `weight_scale_inv`) and `compressed-tensors` (per-channel or
per-tensor `weight_scale`, static `input_scale`); and write the dequantized weights as a plain
float32 checkpoint, the reference transformers loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8 = torch.float8_e4m3fn
FORMATS = ("block", "channel", "tensor")
BLOCK = (32, 16)  # small, uneven blocks: a TP=2 shard of a KV projection starts mid-block
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quantize(w: torch.Tensor, fmt: str,
              block: tuple[int, int] = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, scale) with `w ~= fp8 * scale` (scale broadcast per block, row or tensor)."""
    w = w.float()
    if fmt == "tensor":
        scale = (w.abs().max() / 448).reshape(1)
        return (w / scale).to(FP8), scale
    if fmt == "channel":
        scale = w.abs().amax(dim=1, keepdim=True) / 448
        return (w / scale).to(FP8), scale
    bm, bn = block
    rows, cols = w.shape
    pad = torch.zeros(-(-rows // bm) * bm, -(-cols // bn) * bn)
    pad[:rows, :cols] = w
    blocks = pad.view(pad.shape[0] // bm, bm, pad.shape[1] // bn, bn)
    scale = blocks.abs().amax(dim=(1, 3)) / 448
    full = scale.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:rows, :cols]
    return (w / full).to(FP8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, fmt: str,
               block: tuple[int, int] = BLOCK) -> torch.Tensor:
    """The float32 weight the checkpoint `q`, `scale` stands for (independent of the runtime)."""
    if fmt == "block":
        bm, bn = block
        full = scale.repeat_interleave(bm, 0).repeat_interleave(bn, 1)
        return q.float() * full[: q.shape[0], : q.shape[1]]
    return q.float() * scale.float()


def quantization_config(fmt: str, block: tuple[int, int] = BLOCK) -> dict:
    if fmt == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(block)}
    weights = {"num_bits": 8, "type": "float", "strategy": fmt, "symmetric": True,
               "dynamic": False, "group_size": None, "block_structure": None}
    acts = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True,
            "dynamic": fmt == "channel", "group_size": None, "block_structure": None}
    if fmt == "channel":
        acts["strategy"] = "token"
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": acts}}}


def write_fp8_checkpoint(src: Path, dst: Path, fmt: str, ref: Path | None = None,
                         block: tuple[int, int] = BLOCK) -> Path:
    """`src` quantized as `fmt` into `dst` (`block`: the block format's bm x bk); with `ref`,
    also the dequantized float32 checkpoint (the same config without quantization) there."""
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    out, deq = {}, {}
    for name, t in tensors.items():
        if name.rsplit(".", 2)[-2] in _LINEARS and name.endswith(".weight"):
            q, scale = _quantize(t, fmt, block)
            out[name] = q
            base = name.removesuffix(".weight")
            out[base + (".weight_scale_inv" if fmt == "block" else ".weight_scale")] = scale
            if fmt == "tensor":  # a static activation scale, as compressed-tensors writes it
                out[base + ".input_scale"] = torch.tensor([0.05])
            deq[name] = dequantize(q, scale, fmt, block)
        else:
            out[name] = deq[name] = t
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config":
                                                 quantization_config(fmt, block)}, indent=2))
    if ref is not None:
        shutil.copytree(src, ref)
        save_file(deq, str(ref / "model.safetensors"), metadata={"format": "pt"})
    return dst


def scale_tensor_names(path: Path) -> list[str]:
    return [n for n in load_file(str(path / "model.safetensors")) if "scale" in n]


def corrupt_scale(path: Path, name: str, factor: float) -> None:
    """Multiply one scale tensor of the checkpoint at `path` by `factor`, in place."""
    tensors = load_file(str(path / "model.safetensors"))
    tensors[name] = tensors[name] * factor
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
