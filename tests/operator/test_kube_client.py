"""`KubeClient` (the real `ClusterClient`) against a minimal fake API server: the requests it
sends — server-side apply with our field manager, a merge patch of the status subresource, a 404
read as None, GPU nodes counted from allocatable."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any, ClassVar

import pytest

from radixserve_operator.client import ApplyRejected, KubeClient

RESOURCES = {
    "/api/v1": [
        ("pods", "Pod", True),
        ("services", "Service", True),
        ("nodes", "Node", False),
        ("events", "Event", True),
    ],
    "/apis/apps/v1": [("deployments", "Deployment", True)],
    "/apis/radixserve.dev/v1alpha1": [
        ("inferenceservices", "InferenceService", True),
        ("inferenceservices/status", "InferenceService", True),
    ],
}
NODES = {
    "kind": "NodeList",
    "apiVersion": "v1",
    "metadata": {},
    "items": [
        {
            "metadata": {"name": "gpu-0"},
            "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8"}},
        },
        {"metadata": {"name": "cpu-0"}, "status": {"allocatable": {"cpu": "8"}}},
    ],
}


def _group(gv: str) -> dict[str, Any]:
    group, version = gv.split("/")
    ver = {"groupVersion": gv, "version": version}
    return {"name": group, "versions": [ver], "preferredVersion": ver}


class FakeApi(http.server.BaseHTTPRequestHandler):
    requests: ClassVar[list[tuple[str, str, str, Any]]] = []
    reject = False

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/version":
            return self._send(
                200,
                {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"},
            )
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            groups = [_group("apps/v1"), _group("radixserve.dev/v1alpha1")]
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        if path in RESOURCES:
            res = [
                {
                    "name": n,
                    "kind": k,
                    "namespaced": ns,
                    "singularName": "",
                    "verbs": ["get", "list", "patch"],
                }
                for n, k, ns in RESOURCES[path]
            ]
            gv = path.removeprefix("/apis/").removeprefix("/api/")
            gv = "v1" if path == "/api/v1" else gv
            return self._send(
                200, {"kind": "APIResourceList", "groupVersion": gv, "resources": res}
            )
        if path == "/api/v1/nodes":
            return self._send(200, NODES)
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "NotFound",
            "code": 404,
        }
        return self._send(404, status)

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeApi.requests.append(("PATCH", self.path, self.headers["Content-Type"], body))
        if FakeApi.reject:
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Invalid",
                "code": 422,
                "message": "spec.replicas: Invalid value: -1",
            }
            return self._send(422, status)
        return self._send(200, body)

    def log_message(self, *_a: Any) -> None:
        pass


@pytest.fixture
def kube(tmp_path, monkeypatch) -> KubeClient:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the discovery cache file
    # read at import time from $KUBECONFIG, so set where load_kube_config() looks
    monkeypatch.setattr(
        "kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig")
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    FakeApi.requests, FakeApi.reject = [], False
    yield KubeClient()
    server.shutdown()


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "llm", "namespace": "ns"},
    "spec": {"replicas": 1},
}


def test_apply_is_server_side_apply_with_our_field_manager(kube) -> None:
    out = kube.apply(DEPLOYMENT)
    assert out["spec"] == {"replicas": 1}
    ((method, path, ctype, body),) = FakeApi.requests
    assert (method, ctype) == ("PATCH", "application/apply-patch+yaml")
    assert path.startswith("/apis/apps/v1/namespaces/ns/deployments/llm?")
    assert "fieldManager=radixserve-operator" in path and "force=true" in path
    assert body == DEPLOYMENT


def test_apply_rejected_as_invalid_is_an_apply_rejected(kube) -> None:
    FakeApi.reject = True
    with pytest.raises(ApplyRejected, match="Deployment llm rejected"):
        kube.apply(DEPLOYMENT)


def test_status_is_a_merge_patch_of_the_status_subresource(kube) -> None:
    kube.patch_status("ns", "llm", {"readyReplicas": 1})
    ((_, path, ctype, body),) = FakeApi.requests
    assert path == "/apis/radixserve.dev/v1alpha1/namespaces/ns/inferenceservices/llm/status"
    assert ctype == "application/merge-patch+json"
    assert body == {"status": {"readyReplicas": 1}}


def test_missing_object_reads_as_none(kube) -> None:
    assert kube.get("apps/v1", "Deployment", "ns", "absent") is None


def test_gpu_nodes_counted_from_allocatable(kube) -> None:
    assert kube.count_gpu_nodes("nvidia.com/gpu") == 1
    assert kube.count_gpu_nodes("amd.com/gpu") == 0
