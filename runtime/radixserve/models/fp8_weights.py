"""FP8 checkpoint tensors on their way into the model. Each FP8 weight is paired with its scale
(read first: scales are small) and handed to the layers' usual weight loaders, so tensor-parallel
sharding stays theirs:

- dequantized (`Fp8Dequant`): a lazy `fp8 * scale` whose `narrow` keeps the scale blocks (block
  scales), rows (per-channel) or scalar (per-tensor) of the slice a rank takes, so a rank reads
  only its shard and never a neighbour's scale. The CPU path, and layers not kept below.
- kept in FP8 (`keep_fp8_layers`, on CUDA): a linear layer whose checkpoint weight has a scale
  stores the FP8 bytes and float32 scales (`weight_scale`) and runs `layers/fp8_linear.py`.
  Per-channel or per-tensor: one scale per output row, sharded like a bias (a per-tensor scale is
  repeated over its rows, so a fused QKV keeps q, k and v's own). Block (bm x bk): each block
  row's scales repeated over its bm rows, [rows, ceil(cols / bk)], so rows are cut and fused as
  the weight's are, and a row-parallel layer cuts its columns of scales with its weight columns
  (kept only where a rank's columns start on a block boundary)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from radixserve.layers.fp8_linear import (
    FP8_DTYPE,
    compact_block_scales,
    fits_scaled_mm,
    to_fp8_linear,
)
from radixserve.layers.lazy_weight import LazyWeight, materialize
from radixserve.layers.linear import RowParallelLinear, _Linear
from radixserve.models.quantization import Fp8Scheme
from radixserve.models.weights import WeightNameMap

logger = logging.getLogger(__name__)
_SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale", ".input_scale")


class Fp8Dequant(LazyWeight):
    """`fp8 * scale` of a 2-D FP8 weight, computed in float32 when loaded; `narrow` and `[a:b]` as
    `LazyWeight`, the scale cut to match."""

    def __init__(self, weight: torch.Tensor | LazyWeight, scale: torch.Tensor, scheme: Fp8Scheme,
                 ranges: tuple[tuple[int, int], ...] | None = None) -> None:
        self._weight, self._scale, self._scheme = weight, scale.float(), scheme
        self._full = tuple(weight.shape)
        self._ranges = ranges or tuple((0, n) for n in self._full)
        if len(self._full) != 2:
            raise ValueError(f"an FP8 weight must be 2-D, got shape {self._full}")
        _check_scale(self._full, self._scale, scheme)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(b - a for a, b in self._ranges)

    def dim(self) -> int:
        return 2

    def narrow(self, dim: int, start: int, length: int) -> Fp8Dequant:
        a, b = self._ranges[dim]
        if start < 0 or start + length > b - a:
            raise ValueError(f"narrow({dim}, {start}, {length}) outside a dimension of {b - a}")
        ranges = list(self._ranges)
        ranges[dim] = (a + start, a + start + length)
        return Fp8Dequant(self._weight, self._scale, self._scheme, tuple(ranges))

    def __getitem__(self, key: slice) -> Fp8Dequant:
        start, stop, step = key.indices(self.shape[0])
        assert step == 1, "only contiguous first-dim slices"
        return self.narrow(0, start, stop - start)

    def load(self) -> torch.Tensor:
        (r0, r1), (c0, c1) = self._ranges
        q = materialize(self._weight.narrow(0, r0, r1 - r0).narrow(1, c0, c1 - c0)).float()
        return q * self.scale_for(self._ranges)

    def scale_for(self, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
        """The scale of every element of the block `ranges`, broadcastable to it."""
        (r0, r1), (c0, c1) = ranges
        s, g = self._scale, self._scheme.granularity
        if g == "tensor":
            return s.reshape(())
        if g == "channel":
            return s.reshape(-1)[r0:r1, None]
        bm, bn = self._scheme.block  # type: ignore[misc]
        s = s[r0 // bm: -(-r1 // bm), c0 // bn: -(-c1 // bn)]  # the blocks the slice touches
        s = s.repeat_interleave(bm, 0).repeat_interleave(bn, 1)
        return s[r0 % bm: r0 % bm + r1 - r0, c0 % bn: c0 % bn + c1 - c0]


def _check_scale(shape: tuple[int, ...], scale: torch.Tensor, scheme: Fp8Scheme) -> None:
    rows, cols = shape
    if scheme.granularity == "tensor":
        want: tuple[int, ...] = (1,)
        ok = scale.numel() == 1
    elif scheme.granularity == "channel":
        want, ok = (rows, 1), scale.numel() == rows
    else:
        bm, bn = scheme.block  # type: ignore[misc]
        want = (-(-rows // bm), -(-cols // bn))
        ok = tuple(scale.shape) == want
    if not ok:
        raise ValueError(
            f"{scheme.granularity} FP8 scale of shape {tuple(scale.shape)} does not fit a weight "
            f"of shape {shape} (expected {want})"
        )


def read_scales(files: Iterable[tuple[str, LazyWeight]]) -> dict[str, torch.Tensor]:
    """Every `*.weight_scale_inv`/`*.weight_scale`/`*.input_scale` tensor, read whole (small)."""
    return {n: materialize(t) for n, t in files if n.endswith(_SCALE_SUFFIXES)}


def can_keep_fp8(layer: nn.Module, scheme: Fp8Scheme) -> bool:
    """Whether `layer` can hold this scheme's FP8 weight: a linear layer whose shard fits
    `_scaled_mm` (per-channel, per-tensor), or (block scales) whose rank's input columns start on
    a block boundary and whose blocks split into `tl.dot` steps (16 columns or more)."""
    if not isinstance(layer, _Linear):
        return False
    if scheme.block is None:
        return fits_scaled_mm(layer.weight.shape)
    block_k = scheme.block[1]
    tp = getattr(layer, "tp", None)
    split_k = isinstance(layer, RowParallelLinear) and tp is not None and tp.size > 1
    return (block_k & -block_k) >= 16 and not (split_k and layer.weight.shape[1] % block_k)


def to_fp8_layer(layer: nn.Module, scheme: Fp8Scheme) -> None:
    """`to_fp8_linear` with the scale layout of `scheme` (once: fused projections share a layer)."""
    if layer.weight_scale is None:
        to_fp8_linear(layer, None if scheme.block is None else scheme.block[1])


def keep_fp8_layers(model: nn.Module, names: WeightNameMap, scales: dict[str, torch.Tensor],
                    scheme: Fp8Scheme) -> set[str]:
    """Turn every linear layer whose checkpoint weight has a scale (and that `can_keep_fp8`) into
    an FP8 layer, before any weight is loaded; the HF names of their weights."""
    kept: set[str] = set()
    suffix = "." + scheme.scale_name
    for scale_name in scales:
        if not scale_name.endswith(suffix):
            continue
        name = scale_name.removesuffix(suffix) + ".weight"
        owner = _owner(model, names, name)
        if owner is not None and can_keep_fp8(owner, scheme):
            to_fp8_layer(owner, scheme)
            kept.add(name)
    logger.info("FP8 GEMMs: %d checkpoint weights stay FP8", len(kept))
    return kept


@torch.no_grad()
def dummy_fp8_layers(model: nn.Module, scheme: Fp8Scheme) -> int:
    """Benchmarks without a checkpoint: every linear layer that `can_keep_fp8` becomes FP8 with
    random weights (spread over e4m3's range) and random positive scales of `scheme`'s layout,
    the product of about the size `_fill_dummy` gives float weights; the number of layers."""
    count = 0
    for name, layer in model.named_modules():
        # NOTE: an MoE router (`mlp.gate`) stays in the model dtype, as FP8 checkpoints keep it
        if name.endswith(".gate") or not can_keep_fp8(layer, scheme):
            continue
        to_fp8_layer(layer, scheme)
        w, s = layer.weight, layer.weight_scale
        w.copy_(torch.randn(w.shape, device=w.device).mul_(64).clamp_(-448, 448))
        if scheme.block is None:
            s.uniform_(0.5, 1.5)
        else:  # one scale a checkpoint block, repeated over its rows as a loaded layer holds it
            blocks = torch.empty(-(-s.shape[0] // scheme.block[0]), s.shape[1], device=s.device)
            s.copy_(blocks.uniform_(0.5, 1.5).repeat_interleave(scheme.block[0], 0)[:s.shape[0]])
        s.mul_(w.shape[1] ** -0.5 / 64)
        count += 1
    return count


def compact_fp8_scales(model: nn.Module) -> int:
    """`compact_block_scales` on every block-scaled FP8 layer, once its scales are loaded; the
    number of layers whose scales now cover several rows."""
    return sum(compact_block_scales(m) > 1 for m in model.modules() if isinstance(m, _Linear))


def fp8_weights(
    files: Iterable[tuple[str, LazyWeight]], scales: dict[str, torch.Tensor], scheme: Fp8Scheme,
    kept: set[str] | frozenset[str] = frozenset(),
) -> Iterator[tuple[str, torch.Tensor | LazyWeight | Fp8Dequant]]:
    """The checkpoint's tensors as the model's loaders take them: every FP8 weight paired with its
    scale, dequantized, or for the `kept` names (`keep_fp8_layers`) as stored, followed by its
    `weight_scale` in the layer's layout (float32, one per row, or one per row and block of
    columns). Scale tensors themselves are consumed here; activation scales (`input_scale`,
    static) are not used: the kernels take activations unquantized (weight-only), or
    `_scaled_mm` quantizes each row with its own scale at run time, both at least as accurate."""
    for name, tensor in files:
        if name.endswith(_SCALE_SUFFIXES):
            continue
        scale = scales.get(name.removesuffix(".weight") + "." + scheme.scale_name)
        if not name.endswith(".weight") or scale is None:
            if _is_fp8(tensor):
                raise ValueError(f"FP8 checkpoint tensor {name} has no {scheme.scale_name}")
            yield name, tensor
        elif name in kept:
            _check_scale(tuple(tensor.shape), scale, scheme)
            rows = tensor.shape[0]
            yield name, tensor
            if scheme.block is not None:  # each block row's scales over its rows
                yield name + "_scale", scale.float().repeat_interleave(scheme.block[0], 0)[:rows]
            else:
                yield name + "_scale", scale.float().reshape(-1).expand(rows).contiguous()
        else:
            yield name, Fp8Dequant(tensor, scale, scheme)


def _owner(model: nn.Module, names: WeightNameMap, hf_name: str) -> nn.Module | None:
    ours, _ = names.to_ours(hf_name)
    try:
        return model.get_submodule(ours.rpartition(".")[0])
    except AttributeError:
        return None


def _is_fp8(t: torch.Tensor | LazyWeight) -> bool:
    if isinstance(t, torch.Tensor):
        return t.dtype == FP8_DTYPE
    get_dtype = getattr(t._source, "get_dtype", None)  # a safetensors slice names its dtype
    return get_dtype is not None and get_dtype() == "F8_E4M3"
