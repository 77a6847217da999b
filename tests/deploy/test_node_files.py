"""The real node's files and images, built without a machine to run them on: the configs parse and
say what the node promises (addresses of its own, no resolver outside the cluster, no image
garbage collection), and the sandbox image is a well-formed OCI archive of the binary it names."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import yaml
from scripts.cluster import kwok, node, node_config
from scripts.cluster.controlplane import _apiserver_network
from scripts.cluster.pki import NODE_IP, Pki


def _layout(tmp_path: Path) -> node_config.Layout:
    return node_config.Layout(tmp_path / "state", tmp_path / "images")


def test_kubelet_config_binds_the_node_address_and_keeps_imported_images(tmp_path: Path) -> None:
    cfg = yaml.safe_load(node_config.kubelet_yaml(_layout(tmp_path), tmp_path / "ca.crt"))
    assert cfg["kind"] == "KubeletConfiguration"
    assert cfg["address"] == cfg["healthzBindAddress"] == node_config.NODE_IP == NODE_IP
    assert cfg["readOnlyPort"] == 0 and cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["clusterDNS"] == [node_config.NODE_IP]
    # images are imported, never pulled: garbage collection must never remove them
    assert cfg["imageGCHighThresholdPercent"] == 100
    assert cfg["containerRuntimeEndpoint"] == f"unix://{_layout(tmp_path).socket}"


def test_kube_proxy_listens_on_the_node_subnet_only(tmp_path: Path) -> None:
    cfg = yaml.safe_load(node_config.kube_proxy_yaml(tmp_path / "kubeconfig"))
    assert cfg["mode"] == "iptables"
    assert cfg["nodePortAddresses"] == [node_config.NODE_SUBNET]
    for key in ("healthzBindAddress", "metricsBindAddress"):
        assert cfg[key].startswith(node_config.NODE_IP + ":")


def test_cluster_dns_answers_cluster_names_only(tmp_path: Path) -> None:
    text = node_config.corefile(tmp_path / "kubeconfig")
    assert "forward" not in text and "proxy" not in text  # nothing goes to the machine's resolver
    assert f"bind {node_config.NODE_IP}" in text
    assert text.startswith(node_config.CLUSTER_DOMAIN)
    assert node_config.resolv_conf().split() == ["nameserver", node_config.NODE_IP]


def test_pods_are_not_masqueraded_and_use_their_own_range(tmp_path: Path) -> None:
    bridge = json.loads(node_config.cni_conflist(_layout(tmp_path)))["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": node_config.POD_CIDR}]]
    # address leases live with the cluster, not in the machine's /var/lib/cni
    assert bridge["ipam"]["dataDir"].startswith(str(_layout(tmp_path).state))


def test_fake_nodes_beside_the_real_node_are_tainted_and_unreachable() -> None:
    beside = kwok.nodes(beside_node=True)
    alone = kwok.nodes()
    assert [n["metadata"]["name"] for n in beside] == [n["metadata"]["name"] for n in alone]
    for n in beside:
        assert n["spec"]["taints"] == [kwok.TAINT]
        ip = next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
        assert ip.startswith("127.")  # a dial to its "kubelet" fails at once, on this machine
    assert all("taints" not in n["spec"] for n in alone)
    assert f"--cidr={kwok.POD_CIDR_BESIDE_NODE}" in kwok.args(Path("k"), Path("c"), 1, True)
    assert not kwok.POD_CIDR_BESIDE_NODE.startswith(node_config.POD_CIDR.rsplit(".", 2)[0])


def test_api_server_is_reachable_from_pods_only_beside_the_node(tmp_path: Path) -> None:
    p = Pki(tmp_path)
    alone = _apiserver_network("127.0.0.1", p)
    assert "--endpoint-reconciler-type=none" in alone
    beside = _apiserver_network(NODE_IP, p)
    assert f"--bind-address={NODE_IP}" in beside
    assert not any(a.startswith("--endpoint-reconciler-type") for a in beside)
    assert f"--kubelet-client-certificate={p.admin_crt}" in beside


def test_sandbox_image_archive_is_a_valid_oci_layout(tmp_path: Path) -> None:
    binary = b"\x7fELF not really, but bytes the archive must carry unchanged"
    (tmp_path / "pause").write_bytes(binary)
    with tarfile.open(fileobj=io.BytesIO(node._pause_archive(tmp_path))) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    for name, data in files.items():  # every blob is stored under its own digest
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    [entry] = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == node_config.SANDBOX_IMAGE
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"]["Entrypoint"] == ["/pause"]
    [layer] = manifest["layers"]
    blob = files[f"blobs/sha256/{layer['digest'].split(':')[1]}"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    with tarfile.open(fileobj=io.BytesIO(blob)) as layer_tar:
        member = layer_tar.getmember("pause")
        assert member.mode & 0o111 and layer_tar.extractfile(member).read() == binary
