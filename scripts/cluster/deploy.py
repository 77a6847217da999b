"""``make images deploy``: the project's images on the real node, and the chart installed with real
Helm, its operator running as a pod: what a user tries first after ``make cluster``.

Images are built without Docker (``scripts.images``) and imported into the node's containerd under
the names the chart and the samples pull, once per build: a stamp in the node's image store (which
outlives the cluster) records the build's key.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from . import node

RELEASE = "radixserve"
OPERATOR_NS = "radixserve-system"
IMAGES = {  # what scripts.images builds -> the names the chart and the samples use
    "radixserve-cpu": ("ghcr.io/radixserve/radixserve:0.1.0-cpu",),
    "radixserve-operator": ("ghcr.io/radixserve/radixserve-operator:0.1.0",),
    "radixserve-router": ("ghcr.io/radixserve/radixserve-router:0.1.0",),  # spec.router's default
}
CHART = Path(__file__).resolve().parents[2] / "charts" / "radixserve"


def load_images(state: Path) -> None:
    """Build (cached) and import each image unless the node already holds that very build."""
    from scripts import images

    for name, tags in IMAGES.items():
        archive = images.build(name)
        key = archive.with_suffix(".key").read_text()
        stamp = node.layout(state).images / f"imported-{name}"
        if stamp.is_file() and stamp.read_text() == key and all(
                node.has_image(state, tag) for tag in tags):
            print(f"[deploy] {name}: already on the node as {', '.join(tags)}", flush=True)
            continue
        print(f"[deploy] importing {archive} into the node's containerd", flush=True)
        short = disk_shortfall(node.layout(state).images, archive.stat().st_size)
        if short:
            print(f"[deploy] warning: {short}", flush=True)
        node.import_image(state, archive, images.IMAGES[name].tag, tags)
        stamp.write_text(key)


def disk_shortfall(images_root: Path, archive_bytes: int) -> str | None:
    """Why an import of that size may leave the node short of disk, or None. An import stores the
    archive's content and unpacks it (about twice its size), and the kubelet, below 1% free,
    evicts and deletes the images it can (images here are imported, never pulled back)."""
    images_root.mkdir(parents=True, exist_ok=True)
    disk = shutil.disk_usage(images_root)
    need = 2 * archive_bytes + disk.total // 100
    if disk.free >= need:
        return None
    return (f"{disk.free / 1e9:.1f} GB free where the node keeps its images ({images_root}); "
            f"this import takes up to {2 * archive_bytes / 1e9:.1f} GB and the kubelet deletes "
            f"images below {disk.total / 100 / 1e9:.1f} GB free. Free disk: old image builds "
            "(`python3 -m scripts.images clean`), the archives under ~/.cache/radixserve/images")


def install_chart(kubeconfig: Path, values: dict | None = None) -> None:
    """``helm upgrade --install`` of the chart (helm-python-sdk), waiting for the operator pod."""
    import helm_python as helm

    values = values or {"operator": {"image": {"pullPolicy": "Never"}}}
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=OPERATOR_NS) as cfg:
        try:
            cfg.install(str(CHART), RELEASE, values, namespace=OPERATOR_NS,
                        create_namespace=True, wait="watcher", timeout=300)
        except helm.errors.HelmReleaseError as e:
            if "still in use" not in str(e):
                raise
            cfg.upgrade(str(CHART), RELEASE, values, namespace=OPERATOR_NS, wait="watcher",
                        timeout=300)
