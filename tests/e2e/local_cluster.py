"""The local provider of the real-pod suite: `make cluster`'s control plane with its real node,
the images built without Docker (scripts.images) and imported into the node's containerd under the
names the chart and the samples use."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

IMAGES = {  # what scripts.images builds -> the names the chart and the samples pull
    "radixserve-cpu": ("ghcr.io/radixserve/radixserve:0.1.0-cpu",),
    "radixserve-operator": ("ghcr.io/radixserve/radixserve-operator:0.1.0",),
}


def unavailable_reason() -> str | None:
    """Why the local provider cannot run here, or None."""
    from scripts import images
    from scripts.cluster import controlplane, node

    return controlplane.unavailable_reason() or node.unavailable_reason() or \
        images.unavailable_reason()


def load_images(state: Path) -> None:
    """Build (cached) and import each image the suite runs, unless the node's image store (which
    outlives the cluster) already holds that very build."""
    from scripts import images
    from scripts.cluster import node

    for name, tags in IMAGES.items():
        archive = images.build(name)
        key = archive.with_suffix(".key").read_text()
        stamp = node.layout(state).images / f"imported-{name}"
        if stamp.is_file() and stamp.read_text() == key and all(
                node.has_image(state, tag) for tag in tags):
            continue
        print(f"[real pods] importing {archive} into the node's containerd", flush=True)
        node.import_image(state, archive, images.IMAGES[name].tag, tags)
        stamp.write_text(key)


@contextlib.contextmanager
def local_stack() -> Iterator[tuple[Path, str]]:
    """(kubeconfig, kubectl) of a cluster with the real node and the images on it; the cluster is
    stopped at the end unless it was already running (or RADIXSERVE_E2E_KEEP=1)."""
    from scripts.cluster import controlplane

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no real node here: {reason}")
    running = controlplane.current()
    if running is not None and running.real_node is None:
        pytest.fail("a cluster without the real node is running: `make cluster-down` first")
    cluster = running or controlplane.up(real_node=True)
    try:
        load_images(cluster.state_dir)
        yield cluster.kubeconfig, str(cluster.kubectl)
    finally:
        if running is None and os.environ.get("RADIXSERVE_E2E_KEEP") != "1":
            controlplane.down()
