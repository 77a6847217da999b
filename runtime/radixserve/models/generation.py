"""The model's end-of-sequence ids, from config.json and generation_config.json together."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _as_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def eos_token_ids(model_dir: str | Path) -> set[int]:
    """Every EOS id the model declares (Llama-3 Instruct, for one, lists several in its
    generation config only)."""
    from transformers import AutoConfig, GenerationConfig

    model_dir = Path(model_dir)
    ids = _as_set(getattr(AutoConfig.from_pretrained(model_dir), "eos_token_id", None))
    if (model_dir / "generation_config.json").exists():
        ids |= _as_set(GenerationConfig.from_pretrained(model_dir).eos_token_id)
    return ids
