"""The real node of ``make cluster``: containerd, runc and the CNI bridge from Debian, kubelet and
kube-proxy built from ``k8s.io/kubernetes`` like the control plane, CoreDNS built from its module.

It runs beside the KWOK fake nodes wherever the machine allows it (Linux, root, the Debian packages
of ``make node-deps``); ``RADIXSERVE_CLUSTER_NODE=0`` turns it off. ``up`` starts what is missing
and waits until the node is Ready and cluster DNS answers; ``down`` deletes the node's pods through
the API (so the kubelet tears sandboxes, networks and mounts down as it would on any node), stops
every process, then removes mounts, cgroups, namespaces, links and chains, and says what remains.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from . import build, node_net, procs
from .kube import Api, ApiError, http_ok
from .node_config import (
    DNS_READY_PORT,
    KUBELET_HEALTHZ_PORT,
    NODE_IP,
    NODE_NAME,
    RUN_DIR,
    SANDBOX_IMAGE,
    Layout,
    cni_conflist,
    containerd_toml,
    corefile,
    kube_proxy_yaml,
    kubelet_yaml,
    resolv_conf,
)
from .node_image_ids import drop_stale_ids

ENV_NODE = "RADIXSERVE_CLUSTER_NODE"
ORDER = ("containerd", "coredns", "kube-proxy", "kubelet")
PACKAGES = {"containerd": "containerd", "runc": "runc", "ctr": "containerd",
            "iptables": "iptables", "ip": "iproute2", "conntrack": "conntrack"}
CNI_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
K8S_NS = "k8s.io"


class NodeError(RuntimeError):
    """The node could not be brought up or removed; the message says which part and why."""


def layout(state: Path) -> Layout:
    return Layout(state, build.cache_root() / "containerd")


def _cni_bin_dir() -> str | None:
    return next((d for d in CNI_DIRS if Path(d, "bridge").is_file()), None)


def unavailable_reason() -> str | None:
    """Why no real node runs here (turned off, not root, a package missing), or None."""
    if os.environ.get(ENV_NODE, "1") == "0":
        return f"turned off ({ENV_NODE}=0)"
    if os.uname().sysname != "Linux" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "a real node needs root on Linux (containerd, CNI, iptables)"
    missing = sorted({pkg for tool, pkg in PACKAGES.items() if shutil.which(tool) is None})
    if _cni_bin_dir() is None:
        missing.append("containernetworking-plugins")
    if missing:
        return f"missing Debian packages: {' '.join(missing)} (`make node-deps` installs them)"
    return None


def is_on(state: Path) -> bool:
    """The node was set up in this state dir (its network exists and must be torn down)."""
    return (state / "node" / "sysctl.json").exists()


def prepare_network(state: Path, service_cidr: str, sink_cidrs: tuple[str, ...]) -> None:
    """The node's address must exist before the API server binds it."""
    try:
        node_net.setup(layout(state).files, service_cidr, sink_cidrs)
    except (node_net.NetError, OSError) as e:
        raise NodeError(f"node network: {e}") from None


def _write(path: Path, text: str) -> None:
    """Write only on change: kube-proxy exits when its config file changes under it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _ctr(lay: Layout, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctr", f"--address={lay.socket}", "-n", K8S_NS, *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _pause_archive(bins: Path) -> bytes:
    """An OCI image archive holding only our static pause binary, named SANDBOX_IMAGE."""
    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as tar:
        info = tarfile.TarInfo("pause")
        data = (bins / "pause").read_bytes()
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    layer_digest, layer = blob(layer_buf.getvalue())
    config_digest, config = blob(json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }).encode())
    manifest_digest, manifest = blob(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": len(layer)}],
    }).encode())
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": len(manifest),
        "annotations": {"io.containerd.image.name": SANDBOX_IMAGE,
                        "org.opencontainers.image.ref.name": SANDBOX_IMAGE.rsplit(":", 1)[1]},
    }]}).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
        for digest, data in ((layer_digest, layer), (config_digest, config),
                             (manifest_digest, manifest)):
            files[f"blobs/sha256/{digest.split(':')[1]}"] = data
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def has_image(state: Path, name: str) -> bool:
    out = _ctr(layout(state), "images", "ls", "-q", timeout=60)
    return out.returncode == 0 and name in out.stdout.split()


def import_image(state: Path, archive: Path, name: str, tags: tuple[str, ...] = ()) -> None:
    """Import an image archive into the node's containerd and tag it with ``tags``."""
    lay = layout(state)
    done = _ctr(lay, "images", "import", str(archive), timeout=1800)
    if done.returncode != 0:
        raise NodeError(f"ctr images import {archive}: {done.stderr.strip() or done.stdout}")
    if not has_image(state, name):
        raise NodeError(f"{archive} imported, but holds no image named {name}")
    for tag in tags:
        _ctr(lay, "images", "rm", tag, timeout=60)
        tagged = _ctr(lay, "images", "tag", name, tag, timeout=60)
        if tagged.returncode != 0:
            raise NodeError(f"ctr images tag {name} {tag}: {tagged.stderr.strip()}")
    drop_stale_ids(lambda *args, timeout: _ctr(lay, *args, timeout=timeout))


def _components(lay: Layout, bins: Path, kubeconfig: Path, api: Api) -> list[tuple[str, list[str], Callable[[], bool], float]]:
    f = lay.files
    return [
        ("containerd", ["containerd", f"--config={f / 'containerd.toml'}"],
         lambda: lay.socket.exists() and _ctr(lay, "version", timeout=10).returncode == 0, 60.0),
        ("coredns", [str(bins / "coredns"), f"-conf={f / 'Corefile'}"],
         lambda: http_ok(f"http://{NODE_IP}:{DNS_READY_PORT}/ready"), 60.0),
        ("kube-proxy", [str(bins / "kube-proxy"), f"--config={f / 'kube-proxy.yaml'}"],
         lambda: True, 0.0),
        ("kubelet", [str(bins / "kubelet"), f"--config={f / 'kubelet.yaml'}",
                     f"--kubeconfig={kubeconfig}", f"--root-dir={lay.kubelet_root}",
                     f"--cert-dir={f / 'kubelet-pki'}", f"--hostname-override={NODE_NAME}",
                     f"--node-ip={NODE_IP}", "--v=1"],
         lambda: http_ok(f"http://{NODE_IP}:{KUBELET_HEALTHZ_PORT}/healthz")
         and node_ready(api), 180.0),
    ]


def node_ready(api: Api) -> bool:
    try:
        node = api.get(f"/api/v1/nodes/{NODE_NAME}")
    except (ApiError, OSError):
        return False
    conds = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def up(state: Path, bins: Path, kubeconfig: Path, ca_file: Path, api: Api,
       say: Callable[[str], None]) -> None:
    """Start whatever of the node is not running and wait until it is Ready."""
    lay = layout(state)
    cni_bin = _cni_bin_dir()
    assert cni_bin is not None, "unavailable_reason() is checked first"
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    lay.images.mkdir(parents=True, exist_ok=True)
    f = lay.files
    _write(f / "containerd.toml", containerd_toml(lay, cni_bin))
    _write(lay.cni_conf_dir / "10-radixserve.conflist", cni_conflist(lay))
    _write(f / "kubelet.yaml", kubelet_yaml(lay, ca_file))
    _write(f / "kube-proxy.yaml", kube_proxy_yaml(kubeconfig))
    _write(f / "Corefile", corefile(kubeconfig))
    _write(f / "resolv.conf", resolv_conf())
    lay.kubelet_root.mkdir(parents=True, exist_ok=True)
    for name, argv, healthy, timeout_s in _components(lay, bins, kubeconfig, api):
        binary = os.path.basename(argv[0])
        pid = procs.running(state, name, binary)
        if pid is None:
            pid = procs.start(state, name, argv, dict(os.environ))
            say(f"{name}: started (pid {pid})")
        _wait(state, name, binary, healthy, timeout_s)
        say(f"{name}: ready")
        if name == "containerd":
            # NOTE: imported at every start (a few KB), though the images outlive the node: a
            # kubelet that reached disk pressure deleted it as an unused image, and every pod
            # sandbox then failed with "failed to get sandbox image" (the disk is kept by
            # `scripts/images/prune.py`; `deploy.disk_shortfall` warns before an import)
            archive = f / "pause.tar"
            archive.write_bytes(_pause_archive(bins))
            import_image(state, archive, SANDBOX_IMAGE)
            say(f"sandbox image {SANDBOX_IMAGE} imported")


def _wait(state: Path, name: str, binary: str, healthy: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if procs.running(state, name, binary) is None:
            raise NodeError(f"{name} exited\n--- last lines of its log ---\n"
                            f"{procs.tail(procs.logfile(state, name))}")
        if healthy():
            return
        if time.monotonic() > deadline:
            raise NodeError(f"{name}: not ready after {timeout_s:.0f}s\n--- last lines of its "
                            f"log ---\n{procs.tail(procs.logfile(state, name))}")
        time.sleep(0.5)


# --- down -----------------------------------------------------------------------------------------


def _delete_pods(api: Api, timeout_s: float) -> None:
    """Delete every pod bound to the node and wait until the kubelet has let them go."""
    path = f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE_NAME}"
    try:
        pods = api.get(path).get("items", [])
        for pod in pods:
            meta = pod["metadata"]
            api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        {"gracePeriodSeconds": 2})
        deadline = time.monotonic() + timeout_s
        while api.get(path).get("items") and time.monotonic() < deadline:
            time.sleep(0.5)
    except (ApiError, OSError):
        pass  # the API server is gone: the forced clean-up below still runs


def _pids_of(pred: Callable[[list[str]], bool]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if pred([a.decode(errors="replace") for a in argv if a]):
                pids.append(int(entry.name))
    return pids


def _descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _kill_shims(lay: Layout) -> None:
    """The runc shims (and the containers under them) outlive containerd by design."""
    shims = _pids_of(lambda a: bool(a) and "containerd-shim" in a[0] and str(lay.socket) in a)
    for pid in _descendants(shims):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _mounts_under(roots: tuple[Path, ...]) -> list[str]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[1].replace("\\040", " ") for line in lines]
    prefixes = tuple(str(r) + "/" for r in roots)
    return [p for p in points if p.startswith(prefixes) or p in map(str, roots)]


def _unmount(roots: tuple[Path, ...]) -> list[str]:
    for point in sorted(_mounts_under(roots), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return [f"mount {p}" for p in _mounts_under(roots)]


def _remove_cgroups() -> list[str]:
    left = []
    for top in Path("/sys/fs/cgroup").glob("*/kubepods*"):
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                        reverse=True) + [top]:
            try:
                d.rmdir()
            except OSError:
                pass
        if top.exists():
            left.append(f"cgroup {top}")
    return left


def down(state: Path, api: Api | None, service_cidr: str, sink_cidrs: tuple[str, ...],
         say: Callable[[str], None]) -> list[str]:
    """Remove the node from this machine; returns what could not be removed (empty: all gone)."""
    lay = layout(state)
    if api is not None and procs.running(state, "kubelet", "kubelet") is not None:
        _delete_pods(api, 60.0)
    for name in reversed(ORDER[1:]):
        if procs.stop(state, name, name):
            say(f"stopped {name}")
    if procs.running(state, "containerd", "containerd") is not None:
        for cid in _ctr(lay, "tasks", "ls", "-q", timeout=30).stdout.split():
            _ctr(lay, "tasks", "kill", "-s", "SIGKILL", cid, timeout=30)
        time.sleep(0.5)
        for cid in _ctr(lay, "containers", "ls", "-q", timeout=30).stdout.split():
            _ctr(lay, "tasks", "delete", "-f", cid, timeout=30)
            _ctr(lay, "containers", "rm", cid, timeout=30)
    _kill_shims(lay)
    if procs.stop(state, "containerd", "containerd"):
        say("stopped containerd")
    left = _unmount((lay.kubelet_root, RUN_DIR, lay.images))
    left += _remove_cgroups()
    left += node_net.teardown(lay.files, service_cidr, sink_cidrs)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    return left


def leftovers(state: Path) -> list[str]:
    """What of a node remains on this machine (after ``down``: nothing)."""
    lay = layout(state)
    left = [f"process {n}" for n in ORDER if procs.running(state, n, n) is not None]
    left += [f"process {p}" for p in _pids_of(lambda a: bool(a) and str(lay.socket) in a)]
    left += [f"mount {p}" for p in _mounts_under((lay.kubelet_root, RUN_DIR, lay.images))]
    left += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob("*/kubepods*")]
    return left + node_net.leftovers()
