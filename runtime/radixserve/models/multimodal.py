"""Multimodal checkpoints served as text models (Gemma 3 and Mistral 3 ...ForConditionalGeneration):
their language model is the text architecture built from `text_config` (`hf_config.text_config`),
filled from the checkpoint's language-model tensors under the text model's names. The text classes
are registered under the multimodal names too (`gemma3.py`, `mistral.py`); the LM head is tied to
the embedding as transformers ties it (the loader's `_tie_as_transformers`). The vision tower and
the projector are never read; the API refuses image content.

Both layouts are read: transformers 5's (`model.language_model.*`, `lm_head.*`,
`model.vision_tower.*`, `model.multi_modal_projector.*`) and the one of the checkpoints on the Hub,
saved by transformers 4.5x (`language_model.model.*`, `language_model.lm_head.*`, `vision_tower.*`,
`multi_modal_projector.*`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixserve.models.hf_config import text_config

# checkpoint prefix -> the text model's
_LANGUAGE_MODEL = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
VISION_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                   "multi_modal_projector.")


def is_multimodal(cfg: Any) -> bool:
    return text_config(cfg) is not cfg


def checkpoint_names(cfg: Any) -> Callable[[str], str | None] | None:
    """How the loader renames the checkpoint's tensors for the model built from `cfg`: None for
    a text model (its names are the model's)."""
    return language_model_name if is_multimodal(cfg) else None


def language_model_name(name: str) -> str | None:
    """The text model's name of a checkpoint tensor; None for the vision tower's and the
    projector's. Any other name passes unchanged (the loader reports it if nothing takes it)."""
    if name.startswith(VISION_PREFIXES):
        return None
    for prefix, ours in _LANGUAGE_MODEL:
        if name.startswith(prefix):
            return ours + name[len(prefix):]
    return name
