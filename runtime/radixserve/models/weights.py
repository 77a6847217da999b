"""From Hugging Face weight names to our (fused, sharded) parameters, and back for error messages."""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

import torch
from torch import nn

logger = logging.getLogger(__name__)

# (our name part, HF name part, shard_id): several HF tensors fill one fused parameter.
DENSE_STACKED: tuple[tuple[str, str, object], ...] = (
    (".qkv_proj.", ".q_proj.", "q"),
    (".qkv_proj.", ".k_proj.", "k"),
    (".qkv_proj.", ".v_proj.", "v"),
    (".gate_up_proj.", ".gate_proj.", 0),
    (".gate_up_proj.", ".up_proj.", 1),
)
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")


class WeightNameMap:
    def __init__(self, stacked: Sequence[tuple[str, str, object]] = DENSE_STACKED) -> None:
        self.stacked = stacked

    def to_ours(self, hf_name: str) -> tuple[str, object]:
        m = _EXPERT.search(hf_name)
        if m:
            part = _EXPERT_PARTS.index(m.group(2))
            return hf_name[: m.start()] + (".experts.w2" if part == 2 else ".experts.w13"), (
                int(m.group(1)),
                part,
            )
        for ours, hf, shard_id in self.stacked:
            if hf in hf_name:
                return hf_name.replace(hf, ours), shard_id
        return hf_name, None

    def to_hf(self, name: str, shard_id: object) -> str:
        if isinstance(shard_id, tuple):
            expert, part = shard_id
            return f"{name.rpartition('.')[0]}.{expert}.{_EXPERT_PARTS[part]}.weight"
        for ours, hf, sid in self.stacked:
            if ours in name and sid == shard_id:
                return name.replace(ours, hf)
        return name


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    names: WeightNameMap,
    skip: Sequence[str] = (),
) -> None:
    """Feed each (HF name, full tensor) to the owning layer's `weight_loader`; raise naming every HF
    weight that no tensor provided. Names containing a `skip` part are ignored."""
    params = dict(model.named_parameters())
    loaded: dict[str, set[object]] = defaultdict(set)
    unexpected = []
    for hf_name, tensor in weights:
        if any(s in hf_name for s in skip):
            continue
        name, shard_id = names.to_ours(hf_name)
        if name not in params:
            unexpected.append(hf_name)
            continue
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner).weight_loader(params[name], tensor, shard_id)
        loaded[name].add(shard_id)
    if unexpected:
        logger.warning(
            "ignored %d checkpoint tensors with no matching parameter: %s%s",
            len(unexpected),
            ", ".join(unexpected[:5]),
            " …" if len(unexpected) > 5 else "",
        )
    missing = []
    for name in params:
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        expected = module.shard_ids(attr) if hasattr(module, "shard_ids") else (None,)
        missing += [names.to_hf(name, s) for s in expected if s not in loaded[name]]
    if missing:
        raise ValueError(
            f"checkpoint is missing {len(missing)} weight(s): {', '.join(missing[:10])}"
            f"{' …' if len(missing) > 10 else ''}"
        )
