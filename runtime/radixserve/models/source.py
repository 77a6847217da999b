"""The model a process serves, resolved once when the process starts: its directory (the embedded
model converted, a hub id downloaded) and its checkpoint's transformers config, handed to every
part that needs either instead of each reading them again."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixserve.models.default_model import resolve_model_path


@dataclass(frozen=True)
class ModelSource:
    path: Path
    config: Any  # `AutoConfig.from_pretrained(path)`: a multimodal one holds its `text_config`

    @classmethod
    def resolve(cls, model: str | Path | None) -> ModelSource:
        """`model` as `--model` takes it (None: the embedded model)."""
        from transformers import AutoConfig

        path = resolve_model_path(None if model is None else str(model))
        return cls(path, AutoConfig.from_pretrained(path))
