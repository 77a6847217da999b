"""The project's OCI images built without Docker: a Debian base made by mmdebstrap, a pinned
wheelhouse filled by the host's pip, `buildah bud` of the Dockerfile's targets with no network
in any RUN, and docker-archives for `ctr images import`. CLI: `python3 -m scripts.images`."""

from __future__ import annotations

from .image import archives, build
from .specs import IMAGES
from .tools import unavailable_reason
from .verify import verify

__all__ = ["IMAGES", "archives", "build", "unavailable_reason", "verify"]
