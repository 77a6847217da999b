"""What gets built: the base image's recipe and the images, each a Dockerfile target."""

from __future__ import annotations

from dataclasses import dataclass, field

# The base stands in for the Dockerfile's PYTHON_IMAGE (python:3.11-slim-bookworm): Debian
# bookworm's own Python 3.11 with venv and pip, plus what the final stages take from apt (tini),
# so no RUN needs a network. It is passed as PYTHON_IMAGE, a name no registry serves.
BASE_TAG = "localhost/radixserve-python:3.11-bookworm"
BASE_SUITE = "bookworm"
BASE_MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "python-is-python3",
    "ca-certificates",
    "tini",
)
IMAGE_PYTHON = "3.11"  # the base's Python: the wheelhouse holds wheels for this version

# NOTE: PyPI has no CPU-only torch for Linux; its torch is a CUDA build that runs on CPU and
# brings the CUDA wheels (GBs). Where download.pytorch.org is reachable, the Dockerfile's
# default TORCH_CPU_INDEX gives the small CPU build instead.
TORCH_CPU_VERSION = "2.13.0"


@dataclass(frozen=True)
class LockSpec:
    """One constraints file: what to resolve, and what goes in beside it without dependencies."""

    name: str
    requirements: tuple[str, ...]
    no_deps: tuple[str, ...] = ()
    within: str | None = None  # resolve inside another lock's pins (one version of a package)


@dataclass(frozen=True)
class ImageSpec:
    name: str  # the archive's name, and the image's repository under localhost/
    target: str  # the Dockerfile stage
    locks: tuple[str, ...]  # the constraints files whose pins its pip installs honour
    build_args: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return f"localhost/{self.name}:dev"


IMAGES: dict[str, ImageSpec] = {
    spec.name: spec
    for spec in (
        ImageSpec(
            "radixserve-cpu",
            "runtime-cpu",
            ("build", "cpu"),
            {"TORCH_VERSION": TORCH_CPU_VERSION, "TORCH_CPU_INDEX": "https://pypi.org/simple"},
        ),
        ImageSpec("radixserve-operator", "operator", ("build", "operator")),
        ImageSpec("radixserve-router", "router", ("router",)),
    )
}
