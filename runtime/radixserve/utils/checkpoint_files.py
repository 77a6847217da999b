"""The safetensors files of a checkpoint directory, for every reader of it (the model's weights,
the KV cache's scales)."""
from __future__ import annotations

import json
from pathlib import Path


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / f for f in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors weights in {model_dir} (other formats are not supported)"
        )
    return files
