"""The checkpoint's `quantization_config`, read before any weight is: the FP8 weight formats we load,
and one clear error naming any other method (rather than loading quantized bytes as weights)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED = (
    ("fp8 (Hugging Face FP8: weight_block_size block scales in weight_scale_inv, e4m3; dynamic "
     "or static activation scales)"),
    ("compressed-tensors (8-bit float weights, per-channel, per-tensor or block weight_scale; "
     "static or dynamic activation scales)"),
)


@dataclass(frozen=True)
class Fp8Scheme:
    """How a checkpoint's FP8 weights are scaled: `weight = fp8 * scale` with one scale per
    `block` (rows, cols) tile, per output row (`channel`) or for the whole tensor (`tensor`)."""

    method: str  # "fp8" | "compressed-tensors"
    granularity: str  # "block" | "channel" | "tensor"
    scale_name: str  # the scale tensor's suffix next to `weight`
    block: tuple[int, int] | None = None


def _unsupported(what: str) -> ValueError:
    return ValueError(
        f"quantization {what} is not supported; supported quantization_config methods: "
        f"{'; '.join(SUPPORTED)}. Checkpoints without a quantization_config load as they are "
        "(float16, bfloat16, float32)."
    )


def read_quantization(hf_config: Any) -> Fp8Scheme | None:
    """The FP8 scheme of the checkpoint, None for an unquantized one; ValueError for any other
    quantization method or FP8 variant, before any weight is read."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    if not isinstance(qc, dict):  # a transformers QuantizationConfig object
        qc = qc.to_dict()
    method = qc.get("quant_method")
    if method == "fp8":
        return _hf_fp8(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    return _raise(f"method {method!r}" if method else "with no quant_method")


def _raise(what: str) -> Fp8Scheme:
    raise _unsupported(what)


def _hf_fp8(qc: dict[str, Any]) -> Fp8Scheme:
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        _raise(f"'fp8' with fmt={fmt!r} (only e4m3)")
    block = qc.get("weight_block_size")
    if block is None:
        _raise("'fp8' without weight_block_size (per-tensor fp8 checkpoints use compressed-tensors)")
    if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        _raise(f"'fp8' with weight_block_size={block!r} (two positive ints)")
    # NOTE: a static scheme's `input_scale` tensors are read and left unused: FP8 weights are
    # dequantized (at load, or in the kernel's registers) and activations stay unquantized or are
    # scaled per row at run time, never coarser than one static scale
    if qc.get("activation_scheme", "dynamic") not in ("dynamic", "static"):
        _raise(f"'fp8' with activation_scheme={qc['activation_scheme']!r} (dynamic or static)")
    return Fp8Scheme("fp8", "block", "weight_scale_inv", (block[0], block[1]))


def _compressed_tensors(qc: dict[str, Any]) -> Fp8Scheme:
    fmt = qc.get("format")
    groups = list((qc.get("config_groups") or {}).values())
    if not groups:
        _raise("'compressed-tensors' with no config_groups")
    schemes = {_ct_group(g, fmt) for g in groups}
    if len(schemes) > 1:
        _raise(f"'compressed-tensors' mixing weight schemes {sorted(s.granularity for s in schemes)}")
    return schemes.pop()


def _ct_group(group: dict[str, Any], fmt: str | None) -> Fp8Scheme:
    w = group.get("weights") or {}
    desc = (f"'compressed-tensors' (format={fmt!r}, weights {w.get('num_bits')}-bit "
            f"{w.get('type')} {w.get('strategy')})")
    if fmt not in ("float-quantized", "naive-quantized") or w.get("type") != "float" \
            or w.get("num_bits") != 8 or w.get("dynamic") or not w.get("symmetric", True):
        _raise(desc)
    act = group.get("input_activations")
    if act is not None and (act.get("type") != "float" or act.get("num_bits") != 8):
        _raise(f"{desc} with {act.get('num_bits')}-bit {act.get('type')} activations")
    strategy = w.get("strategy")
    if strategy in ("channel", "tensor"):
        return Fp8Scheme("compressed-tensors", strategy, "weight_scale")
    if strategy == "block":
        block = w.get("block_structure") or [128, 128]
        return Fp8Scheme("compressed-tensors", "block", "weight_scale", (block[0], block[1]))
    return _raise(desc)
