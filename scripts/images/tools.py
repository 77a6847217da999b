"""Whether this machine can build the images, and the Debian tools it needs."""

from __future__ import annotations

import os
import shutil
import sys

from .paths import logs_dir
from .progress import log, run_logged
from .specs import IMAGE_PYTHON

TOOLS = {"buildah": "buildah", "mmdebstrap": "mmdebstrap"}  # command -> Debian package


def missing_tools() -> list[str]:
    return [cmd for cmd in TOOLS if shutil.which(cmd) is None]


def unavailable_reason() -> str | None:
    """Why the images cannot be built here, or None."""
    if sys.platform != "linux":
        return f"building the images needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "building the images needs root (buildah and mmdebstrap run rootful here)"
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if host != IMAGE_PYTHON:
        return (f"the wheelhouse is filled by the host's pip for the images' Python {IMAGE_PYTHON}; "
                f"this Python is {host}")
    missing = missing_tools()
    if missing and shutil.which("apt-get") is None:
        return f"{', '.join(missing)} not found and no apt-get to install them"
    return None


def ensure_tools() -> None:
    """Install buildah and mmdebstrap from Debian where they are missing."""
    missing = missing_tools()
    if not missing:
        return
    packages = sorted({TOOLS[cmd] for cmd in missing})
    log(f"tools: apt-get install {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run_logged(["apt-get", "update"], logs_dir() / "apt-get-update.log", "apt-get update", env=env)
    run_logged(["apt-get", "install", "-y", "--no-install-recommends", *packages],
               logs_dir() / "apt-get.log", "apt-get install", env=env)
    still = missing_tools()
    if still:
        raise RuntimeError(f"{', '.join(still)} still missing after apt-get install")
