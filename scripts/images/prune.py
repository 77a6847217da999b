"""Dangling images that no target's latest build uses, removed after each build. Every build tags
its image anew and commits new layers for the steps whose inputs changed, so each one leaves the
last one's behind (6 GB a CPU image). On the disk that also holds the node's containerd, they ran
the node into disk pressure, and the kubelet then deleted images it cannot pull back (the pause
image first: every pod's sandbox failed). Each target's build keeps what its log names (layers it
committed or took from the cache), so the next build of any target still finds its cache."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .paths import cache_root
from .progress import log

# `buildah bud --layers` prints "--> Using cache <full id>" and "--> <short id>" for every step
_STEP_ID = re.compile(r"^--> (?:Using cache )?([0-9a-f]{11,64})\s*$", re.MULTILINE)


def used_ids(bud_log: str) -> set[str]:
    """The image IDs (full, or buildah's 11-hex short form) a build log names."""
    return set(_STEP_ID.findall(bud_log))


def stale(dangling: list[str], kept: set[str]) -> list[str]:
    """The dangling IDs (full, `sha256:` or not) that no kept ID (full or short) names."""
    bare = [d.removeprefix("sha256:") for d in dangling]
    return [d for d in bare if not any(d.startswith(k) for k in kept)]


def _ids_file(name: str) -> Path:
    return cache_root() / "layers" / f"{name}.ids"


def prune_after_build(name: str, bud_log: Path) -> None:
    """Record what target `name`'s build used, then remove the dangling images that no target's
    latest build uses. A log naming nothing (its format changed) prunes nothing."""
    ids = used_ids(bud_log.read_text(errors="replace"))
    if not ids:
        log(f"{name}: no layer IDs in {bud_log}; old images kept")
        return
    path = _ids_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(sorted(ids)) + "\n")
    kept = {i for f in path.parent.glob("*.ids") for i in f.read_text().split()}
    proc = subprocess.run(["buildah", "images", "--filter", "dangling=true", "--noheading",
                           "--no-trunc", "--format", "{{.ID}}"],
                          capture_output=True, text=True, check=False)
    removed = 0
    for image_id in stale(proc.stdout.split(), kept):
        # an image a container still uses stays; the next build tries again
        if subprocess.run(["buildah", "rmi", image_id], capture_output=True,
                          check=False).returncode == 0:
            removed += 1
    if removed:
        log(f"{name}: removed {removed} images no current build uses")
