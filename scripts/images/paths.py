"""Where the image build keeps what it makes: all under one cache directory, never the repo."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS_DIR = Path(__file__).resolve().parent / "constraints"


def cache_root() -> Path:
    env = os.environ.get("RADIXSERVE_IMAGES_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "radixserve" / "images"


def wheelhouse() -> Path:
    """Wheels the host's pip fills; the builds read it read-only with pip's --no-index."""
    return cache_root() / "wheelhouse"


def archives_dir() -> Path:
    return cache_root() / "archives"


def logs_dir() -> Path:
    return cache_root() / "logs"


def base_dir() -> Path:
    """The base image's rootfs tarball and the key of the recipe that made it."""
    return cache_root() / "base"
