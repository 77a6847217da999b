"""The model-download init container, for real: a Hugging Face hub in the cluster (a pod running
tests/deploy/fake_hub.py over the image's converted embedded model, as repo `local/smollm2`), an
InferenceService of that hub model, its init container downloading into the model cache (an
emptyDir, then a claim on a local volume of the node), the server loading it offline and
answering. On the real node of `make cluster`; runs before the real-pod suite's uninstall."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import REPO, RUNTIME_CPU_IMAGE, Stack
from tests.e2e.in_cluster import ASK_CAPITAL, run_in_pod
from tests.e2e.kind_cluster import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(3600)]

SAMPLE = REPO / "manifests" / "samples" / "inferenceservice-cpu.yaml"
REPO_ID = "local/smollm2"
HUB = "fake-hub"
NAME = "hub-model"
# what the operator would read from the hub's config.json (SmolLM2-135M), given as hints
SHAPE = {"parameterCount": "135M", "numAttentionHeads": 9, "numKeyValueHeads": 3,
         "numHiddenLayers": 30, "headDim": 64, "dtype": "float32"}



def _hub_objects(namespace: str) -> list[dict]:
    labels = {"app.kubernetes.io/name": HUB}
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": HUB, "labels": labels},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "hub", "image": RUNTIME_CPU_IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "/hub/fake_hub.py", REPO_ID,
                            "/opt/models/SmolLM2-135M-Instruct", "8080"],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2},
                "volumeMounts": [{"name": "hub", "mountPath": "/hub"}],
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
            "volumes": [{"name": "hub", "configMap": {"name": HUB}}],
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": HUB},
               "spec": {"selector": labels, "ports": [{"port": 8080, "targetPort": 8080}]}}
    return [pod, service]


@pytest.fixture(scope="module")
def hub(stack: Stack) -> str:
    """The in-cluster hub's endpoint."""
    k, ns = stack.kubectl, stack.serving_ns
    source = (REPO / "tests" / "deploy" / "fake_hub.py").read_text()
    k("create", "configmap", HUB, "-n", ns, "--from-literal=fake_hub.py=" + source)
    k("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(_hub_objects(ns)))
    k("wait", "-n", ns, "--for=condition=Ready", f"pod/{HUB}", "--timeout=300s", timeout=330)
    yield f"http://{HUB}.{ns}.svc:8080"
    k("delete", "pod,service,configmap", HUB, "-n", ns, "--wait=false", check=False)


def _resource(hub: str, cache: dict) -> dict:
    sample = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"]["name"] = NAME
    spec = sample["spec"]
    spec["model"] = {"source": REPO_ID, "parameters": SHAPE, "cache": cache}
    spec["env"] = [{"name": "HF_ENDPOINT", "value": hub}]
    spec["resources"]["requests"] = {"cpu": "250m", "memory": "1Gi"}
    return sample


def _serve_and_ask(stack: Stack, hub: str, cache: dict) -> dict:
    """Apply the resource, wait for Ready; its pod, with the init container's log and the answer."""
    k, ns = stack.kubectl, stack.serving_ns
    k("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(_resource(hub, cache)))

    def ready() -> dict | None:
        obj = k.get("rsvc", NAME, ns) or {}
        cond = next((c for c in obj.get("status", {}).get("conditions", [])
                     if c["type"] == "Ready"), {})
        return obj if cond.get("status") == "True" else None

    wait_for(f"{NAME} Ready", ready, timeout=900, interval=3)
    (pod,) = [p for p in k.json("get", "pods", "-n", ns, "-l",
                                f"app.kubernetes.io/instance={NAME}")["items"]
              if not p["metadata"].get("deletionTimestamp")]
    init = pod["status"]["initContainerStatuses"][0]
    assert init["name"] == "model-download"
    assert init["state"]["terminated"]["exitCode"] == 0, init
    init_log = k("logs", pod["metadata"]["name"], "-n", ns, "-c", "model-download")
    answer = run_in_pod(stack, ASK_CAPITAL, f"http://{NAME}.{ns}.svc:8000/v1", REPO_ID)
    return {"pod": pod, "init_log": init_log, "answer": answer}


def _file_downloads(stack: Stack) -> int:
    """Files the hub has sent so far (its log: a line per request)."""
    log = stack.kubectl("logs", HUB, "-n", stack.serving_ns)
    return sum(1 for line in log.splitlines() if line.startswith(f"GET /{REPO_ID}/resolve/"))


def _delete(stack: Stack) -> None:
    k, ns = stack.kubectl, stack.serving_ns
    k("delete", "rsvc", NAME, "-n", ns, "--ignore-not-found", "--timeout=180s", timeout=240)
    wait_for(f"{NAME}'s pods gone", lambda: not k(
        "get", "pods", "-n", ns, "-l", f"app.kubernetes.io/instance={NAME}", "-o", "name").strip(),
        timeout=300, interval=3)


def test_the_init_container_downloads_into_an_emptydir_and_the_server_answers(
        stack: Stack, hub: str) -> None:
    try:
        got = _serve_and_ask(stack, hub, {"type": "emptyDir", "sizeLimit": "2Gi"})
    finally:
        _delete(stack)
    assert f"download: {REPO_ID}@main from {hub}" in got["init_log"], got["init_log"]
    assert "ready in" in got["init_log"], got["init_log"]
    assert "paris" in got["answer"]["choices"][0]["message"]["content"].lower(), got["answer"]


def test_a_claim_on_a_local_volume_keeps_the_download_across_pods(stack: Stack, hub: str) -> None:
    """The second pod's init container finds the model in the claim and fetches nothing."""
    if not stack.local:
        pytest.skip("the local volume is a folder on the real node's host (the local provider)")
    k, ns = stack.kubectl, stack.serving_ns
    folder = Path(tempfile.mkdtemp(prefix="rsv-model-cache-"))
    os.chmod(folder, 0o777)  # a hostPath volume is not chowned to the pod's fsGroup
    pv = f"{NAME}-{uuid.uuid4().hex[:6]}"
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
              "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                       "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                       "hostPath": {"path": str(folder), "type": "Directory"},
                       "claimRef": {"namespace": ns, "name": f"{NAME}-cache"}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": f"{NAME}-cache", "namespace": ns},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                      "resources": {"requests": {"storage": "2Gi"}}}}
    k("apply", "-f", "-", input=yaml.safe_dump_all([volume, claim]))
    try:
        cache = {"type": "sharedPVC", "claimName": f"{NAME}-cache"}
        first = _serve_and_ask(stack, hub, cache)
        assert "paris" in first["answer"]["choices"][0]["message"]["content"].lower()
        assert list(folder.glob("huggingface/hub/models--local--smollm2/snapshots/*/*.safetensors"))
        fetched = _file_downloads(stack)
        assert fetched >= 2, "config.json and the safetensors at least"
        k("delete", "pod", first["pod"]["metadata"]["name"], "-n", ns, "--wait=true",
          timeout=200)
        second = _serve_and_ask(stack, hub, cache)
        refetched = _file_downloads(stack) - fetched
    finally:
        _delete(stack)
        k("delete", "pvc", f"{NAME}-cache", "-n", ns, "--ignore-not-found", "--wait=false")
        k("delete", "pv", pv, "--ignore-not-found", "--wait=false")
        shutil.rmtree(folder, ignore_errors=True)  # the model's copy (about 0.5 GB) on the host
    assert second["pod"]["metadata"]["uid"] != first["pod"]["metadata"]["uid"]
    # the snapshot was complete in the claim: the hub was asked for the revision, no file again
    assert refetched == 0, refetched
    assert "ready in" in second["init_log"], second["init_log"]
    assert "paris" in second["answer"]["choices"][0]["message"]["content"].lower()
