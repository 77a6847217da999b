"""A PEFT LoRA adapter read for serving: `adapter_config.json` and `adapter_model.safetensors`,
checked against the model it is served beside before any tensor is read, its B scaled once.

PEFT's update of a targeted projection is `B @ A @ x * scaling`, scaling = lora_alpha / r
(lora_alpha / sqrt(r) with rsLoRA), where `rank_pattern` and `alpha_pattern` may give a module
its own r and alpha (keys matched against the module's name as PEFT matches them: the whole
name, or a dotted suffix of it, as a regular expression). Each module's r is its A's row count.
Refused, with the reason: another PEFT method, DoRA, trained biases, `modules_to_save`, a module
that is not one of a decoder layer's linear projections, a shape the model does not have, and a
rank above the pool's."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from radixserve.layers.lora import LoRATarget, full_shape, lora_parts
from radixserve.lora.source import CONFIG_FILE, WEIGHTS_FILE, AdapterError, resolve_adapter_dir
from radixserve.models.weights import WeightNameMap

_PREFIX = "base_model.model."  # PEFT's name of the wrapped model
_MATRIX = re.compile(r"^(?P<module>.+)\.lora_(?P<m>[AB])\.weight$")
# (config key, the value that means "not used") of PEFT features the update above leaves out
_UNSUPPORTED = (("use_dora", False), ("bias", "none"), ("lora_bias", False),
                ("modules_to_save", None), ("fan_in_fan_out", False), ("layer_replication", None),
                ("trainable_token_indices", None), ("target_parameters", None))


@dataclass(frozen=True)
class LoRAAdapter:
    """An adapter on the host. `weights`: (the model's module name, projection) -> (A [r, in],
    B [out, r] times its scaling), whole (each TP rank takes its shard when it fills a slot)."""

    name: str
    path: str
    rank: int  # the largest of its modules'
    weights: dict[tuple[str, object], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)


def read_config(path: Path) -> dict[str, Any]:
    """The adapter's `adapter_config.json`, refused unless a plain LoRA served as `B @ A`."""
    file = path / CONFIG_FILE
    if not path.is_dir():
        raise AdapterError(f"{path}: no such adapter directory")
    try:
        cfg = json.loads(file.read_text())
    except OSError as e:
        raise AdapterError(f"{file}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise AdapterError(f"{file}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise AdapterError(f"{file}: not a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{file}: peft_type {cfg['peft_type']!r}: only LORA adapters are served")
    for key, unused in _UNSUPPORTED:
        if cfg.get(key, unused) not in (unused, [], {}):
            raise AdapterError(f"{file}: {key}={cfg[key]!r} is not supported")
    for key in ("r", "lora_alpha"):
        if not _positive(cfg.get(key)):
            raise AdapterError(f"{file}: {key} must be a positive number, got {cfg.get(key)!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        patterns = cfg.get(key) or {}
        if not isinstance(patterns, dict) or not all(_positive(v) for v in patterns.values()):
            raise AdapterError(f"{file}: {key} must map module patterns to positive numbers")
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as e:
                raise AdapterError(f"{file}: {key}: {pattern!r} is not a regular expression "
                                   f"({e})") from None
    return cfg


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def config_rank(source: str) -> int:
    """The largest rank an adapter's config declares (its `r` and `rank_pattern`)."""
    cfg = read_config(resolve_adapter_dir(source))
    return int(max([cfg["r"], *(cfg.get("rank_pattern") or {}).values()]))


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """PEFT's per-module override: the first key naming the module whole or a dotted suffix."""
    for key, value in patterns.items():
        if key == module or re.fullmatch(rf"(.*\.)?({key})", module):
            return value
    return default


def _scaling(cfg: dict[str, Any], module: str, rank: int) -> float:
    alpha = _pattern_value(cfg.get("alpha_pattern") or {}, module, cfg["lora_alpha"])
    return alpha / (math.sqrt(rank) if cfg.get("use_rslora") else rank)


def _find(model: nn.Module, module: str) -> tuple[str, LoRATarget, object] | None:
    """(our module name, the layer, its projection) of a checkpoint's module name (`model.layers.
    3.self_attn.q_proj`), or None where the model has no LoRA-capable projection of that name."""
    names: WeightNameMap = getattr(model, "weight_names", WeightNameMap())
    ours, part = names.to_ours(module + ".weight")
    owner = ours.removesuffix(".weight")
    try:
        layer = model.get_submodule(owner)
    except AttributeError:
        return None
    if not isinstance(layer, LoRATarget) or part not in lora_parts(layer):
        return None
    return owner, layer, part


def _shapes(file: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except OSError as e:
        raise AdapterError(f"{file}: cannot read it ({e.strerror or e})") from None
    except SafetensorError as e:  # a corrupt header
        raise AdapterError(f"{file}: not a safetensors file ({e})") from None


def _plan(path: Path, model: nn.Module, max_rank: int) -> dict[tuple[str, object], tuple[str, int]]:
    """Check an adapter against the model from its config and tensor headers alone: (our module,
    projection) -> (its checkpoint module name, rank)."""
    read_config(path)
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise AdapterError(f"{path}: no {WEIGHTS_FILE} (only safetensors adapters are served)")
    shapes = _shapes(file)
    found = {}
    modules: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        m = _MATRIX.match(key.removeprefix(_PREFIX))
        if m is None:
            raise AdapterError(f"{file}: {key}: not a LoRA A or B matrix of a linear projection "
                               "(trained or saved base weights are not served)")
        modules.setdefault(m["module"], {})[m["m"]] = shape
    for module, mats in modules.items():
        hit = _find(model, module)
        if hit is None:
            raise AdapterError(f"{file}: {module}: the model has no such linear projection "
                               f"(served: q/k/v/o_proj, gate/up/down_proj of its decoder layers)")
        owner, layer, part = hit
        if set(mats) != {"A", "B"}:
            raise AdapterError(f"{file}: {module}: has lora_{''.join(mats)} without its pair")
        (r, fan_in), (fan_out, r_b) = mats["A"], mats["B"]
        if r != r_b:
            raise AdapterError(f"{file}: {module}: lora_A has rank {r}, lora_B {r_b}")
        if r > max_rank:
            raise AdapterError(f"{file}: {module}: rank {r} is above the server's --max-lora-rank "
                               f"{max_rank}")
        want_out, want_in = full_shape(layer, part)
        if (fan_out, fan_in) != (want_out, want_in):
            raise AdapterError(f"{file}: {module}: adapts a [{fan_out}, {fan_in}] projection; the "
                               f"model's is [{want_out}, {want_in}] (an adapter of another model?)")
        found[(owner, part)] = (module, r)
    if not found:
        raise AdapterError(f"{file}: holds no LoRA matrices")
    return found


def check_adapters(model_dir: Path, adapters: dict[str, str], max_rank: int | None) -> None:
    """Raise AdapterError naming the first of `adapters` (name -> directory or hub id, fetched
    here as the server would) that cannot be served
    beside the model in `model_dir` with slots of `max_rank` (None: the largest rank among them,
    at least 16), from configs and tensor headers alone: the model is built on the meta device,
    its shapes without any memory, so the parent process checks before anything loads."""
    from radixserve.models.loader import meta_model

    model = meta_model(model_dir)
    ranks = {name: _naming(name, config_rank, source) for name, source in adapters.items()}
    rank = max_rank or max([16, *ranks.values()])
    for name, source in adapters.items():
        _naming(name, _plan, resolve_adapter_dir(source), model, rank)


def _naming(name: str, check: Any, *args: Any) -> Any:
    """`check(*args)`, its AdapterError prefixed with the adapter's name."""
    try:
        return check(*args)
    except AdapterError as e:
        raise AdapterError(f"adapter {name}: {e}") from None


def read_adapter(name: str, source: str | Path, model: nn.Module, max_rank: int,
                 dtype: torch.dtype) -> LoRAAdapter:
    """The adapter at `source` (a directory or a hub id, `resolve_adapter_dir`), checked first
    as `check_adapters` checks, its matrices in `dtype` on the host, each B times its module's
    scaling."""
    from safetensors import safe_open

    path = resolve_adapter_dir(source)
    plan = _plan(path, model, max_rank)
    cfg = read_config(path)
    weights = {}
    with safe_open(str(path / WEIGHTS_FILE), framework="pt", device="cpu") as f:
        keys = {k.removeprefix(_PREFIX): k for k in f.keys()}  # noqa: SIM118
        for target, (module, rank) in plan.items():
            a = f.get_tensor(keys[f"{module}.lora_A.weight"])
            b = f.get_tensor(keys[f"{module}.lora_B.weight"]).float() * _scaling(cfg, module, rank)
            weights[target] = (a.to(dtype), b.to(dtype))
    return LoRAAdapter(name, str(path), max(r for _, r in plan.values()), weights)
