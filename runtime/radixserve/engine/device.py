from __future__ import annotations

import torch


def resolve_device(spec: str) -> torch.device:
    """`auto` picks CUDA when present; an explicit CUDA request on a machine without one fails."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(spec)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev
