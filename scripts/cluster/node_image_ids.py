"""Image records the node's containerd keeps under their ID alone. CRI names every image it sees
by its config digest as well (`sha256:<id>`), and that record outlives the tag: once a rebuilt
image takes the tag over, the old one's content and unpacked layers (11 GB for the CPU image)
stay referenced, and each rebuild's import leaked that much of the disk the kubelet watches."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

Ctr = Callable[..., subprocess.CompletedProcess[str]]


def listed(images_ls: str) -> dict[str, str]:
    """`ctr images ls` output -> ref: manifest (or index) digest."""
    rows = [line.split() for line in images_ls.splitlines()[1:] if line.strip()]
    return {row[0]: row[2] for row in rows if len(row) >= 3}


def stale_ids(refs: dict[str, str], config_of: Callable[[str], str | None]) -> list[str]:
    """The `sha256:` refs that name no named image's config (`config_of`: a manifest digest ->
    its config digest, None where unreadable: then nothing is called stale)."""
    configs = set()
    for ref, digest in refs.items():
        if not ref.startswith("sha256:"):
            config = config_of(digest)
            if config is None:
                return []
            configs.add(config)
    return sorted(ref for ref in refs if ref.startswith("sha256:") and ref not in configs)


def drop_stale_ids(ctr: Ctr) -> list[str]:
    """Remove the ID-only records no tag's image uses (their content is collected at once);
    returns them."""
    out = ctr("images", "ls", timeout=60)
    if out.returncode != 0:
        return []

    def config_of(digest: str) -> str | None:
        blob = ctr("content", "get", digest, timeout=60)
        if blob.returncode != 0:
            return None
        doc = json.loads(blob.stdout)
        if "manifests" in doc:  # an index: its first manifest (one platform here)
            return config_of(doc["manifests"][0]["digest"])
        return doc.get("config", {}).get("digest")

    stale = stale_ids(listed(out.stdout), config_of)
    for ref in stale:
        ctr("images", "rm", "--sync", ref, timeout=600)
    return stale
