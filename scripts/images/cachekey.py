"""Content keys: an image is rebuilt only when the key of what goes into it changes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path


def files_digest(root: Path, rel_paths: Iterable[str]) -> str:
    """sha256 over (path, content) of each file, in sorted path order: a renamed, added,
    removed or edited file changes it; the order the paths come in does not."""
    h = hashlib.sha256()
    for rel in sorted(set(rel_paths)):
        data = (root / rel).read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def image_key(parts: Mapping[str, str]) -> str:
    """One key from named parts (digests, build args, tags), independent of their order."""
    return hashlib.sha256(json.dumps(dict(parts), sort_keys=True).encode()).hexdigest()


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
