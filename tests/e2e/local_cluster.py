"""The local provider of the real-pod suite: `make cluster`'s control plane with its real node,
the images built without Docker (scripts.images) and imported into the node's containerd under the
names the chart and the samples use."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def unavailable_reason() -> str | None:
    """Why the local provider cannot run here, or None."""
    try:
        from scripts import images
        from scripts.cluster import controlplane, node
    except ImportError as e:  # a machine without the dev extra (the GPU machine)
        return f"the cluster scripts cannot be imported: {e}"

    return controlplane.unavailable_reason() or node.unavailable_reason() or \
        images.unavailable_reason()


@contextlib.contextmanager
def local_stack() -> Iterator[tuple[Path, str]]:
    """(kubeconfig, kubectl) of a cluster with the real node and the images on it; the cluster is
    stopped at the end unless it was already running (or RADIXSERVE_E2E_KEEP=1)."""
    from scripts.cluster import controlplane, deploy

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no real node here: {reason}")
    running = controlplane.current()
    if running is not None and running.real_node is None:
        pytest.fail("a cluster without the real node is running: `make cluster-down` first")
    cluster = running or controlplane.up(real_node=True)
    try:
        deploy.load_images(cluster.state_dir)
        yield cluster.kubeconfig, str(cluster.kubectl)
    finally:
        if running is None and os.environ.get("RADIXSERVE_E2E_KEEP") != "1":
            controlplane.down()
