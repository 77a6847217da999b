"""LoRA adapters on the real node: two PEFT adapters of the image's embedded model on a Hugging
Face hub in the cluster (a pod running tests/deploy/fake_hub.py over a ConfigMap of their files),
an InferenceService of the CPU sample with both in spec.lora.adapters, each fetched by its own
init container into the model cache, and the server answering through each adapter, and through
the base model, by the Service's DNS name."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import REPO, RUNTIME_CPU_IMAGE, Stack
from tests.e2e.in_cluster import ASK_CAPITAL, run_in_pod
from tests.e2e.kind_cluster import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(3600)]

SAMPLE = REPO / "manifests" / "samples" / "inferenceservice-cpu.yaml"
HUB = "lora-hub"
NAME = "lora-cpu"
# rank 2 on q_proj alone: both adapters' files fit one ConfigMap (at most 1 MiB)
ADAPTERS = {"sql": ("org/sql-lora", 1), "chat": ("org/chat-lora", 2)}
FILES = ("adapter_config.json", "adapter_model.safetensors")


def _adapter_files(root: Path) -> dict[str, bytes]:
    """Each adapter's files, made by PEFT on the embedded model, keyed `NAME.FILE`."""
    from radixserve.models.default_model import resolve_model_path
    from tests.peft_adapters import write_peft_adapter

    base = resolve_model_path(None)
    out = {}
    for name, (_, seed) in ADAPTERS.items():
        # alpha 256 (scale 128): at PEFT's default scale a rank-2 q_proj adapter leaves the
        # embedded model's answer unchanged, so it could not tell an adapter's answer from the base's
        path = write_peft_adapter(base, root / name, seed, r=2, lora_alpha=256,
                                  target_modules=["q_proj"])
        out |= {f"{name}.{f}": (path / f).read_bytes() for f in FILES}
    return out


def _hub_objects(files: dict[str, bytes]) -> list[dict]:
    script = (REPO / "tests" / "deploy" / "fake_hub.py").read_text()
    config_map = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": HUB},
        "data": {"fake_hub.py": script},
        "binaryData": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }
    items = [{"key": "fake_hub.py", "path": "fake_hub.py"}] + [
        {"key": f"{name}.{f}", "path": f"{name}/{f}"} for name in ADAPTERS for f in FILES]
    labels = {"app.kubernetes.io/name": HUB}
    repos = [x for name, (repo_id, _) in ADAPTERS.items() for x in (repo_id, f"/hub/{name}")]
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": HUB, "labels": labels},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "hub", "image": RUNTIME_CPU_IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "/hub/fake_hub.py", *repos, "8080"],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2},
                "volumeMounts": [{"name": "hub", "mountPath": "/hub"}],
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
            "volumes": [{"name": "hub", "configMap": {"name": HUB, "items": items}}],
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": HUB},
               "spec": {"selector": labels, "ports": [{"port": 8080, "targetPort": 8080}]}}
    return [config_map, pod, service]


@pytest.fixture(scope="module")
def hub(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The in-cluster hub's endpoint, serving both adapters."""
    k, ns = stack.kubectl, stack.serving_ns
    objects = _hub_objects(_adapter_files(tmp_path_factory.mktemp("adapters")))
    # NOTE: create, not apply: apply's last-applied annotation would hold the ConfigMap's ~0.8 MB
    # again, past an object's 256 KiB of annotations
    k("create", "-n", ns, "-f", "-", input=yaml.safe_dump_all(objects))
    k("wait", "-n", ns, "--for=condition=Ready", f"pod/{HUB}", "--timeout=300s", timeout=330)
    yield f"http://{HUB}.{ns}.svc:8080"
    k("delete", "pod,service,configmap", HUB, "-n", ns, "--wait=false", check=False)


def _resource(hub: str) -> dict:
    sample = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"]["name"] = NAME
    spec = sample["spec"]
    spec["lora"] = {"adapters": [{"name": n, "source": repo_id}
                                 for n, (repo_id, _) in ADAPTERS.items()]}
    spec["env"] = [{"name": "HF_ENDPOINT", "value": hub}]
    spec["resources"]["requests"] = {"cpu": "250m", "memory": "1Gi"}
    return sample


def test_two_adapters_from_the_hub_answer_by_the_services_name(stack: Stack, hub: str) -> None:
    k, ns = stack.kubectl, stack.serving_ns
    k("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(_resource(hub)))
    base_url = f"http://{NAME}.{ns}.svc:8000/v1"
    try:
        def ready() -> dict | None:
            obj = k.get("rsvc", NAME, ns) or {}
            cond = next((c for c in obj.get("status", {}).get("conditions", [])
                         if c["type"] == "Ready"), {})
            return obj if cond.get("status") == "True" else None

        wait_for(f"{NAME} Ready", ready, timeout=900, interval=3)
        (pod,) = [p for p in k.json("get", "pods", "-n", ns, "-l",
                                    f"app.kubernetes.io/instance={NAME}")["items"]
                  if not p["metadata"].get("deletionTimestamp")]
        inits = {s["name"]: s["state"].get("terminated", {}).get("exitCode")
                 for s in pod["status"]["initContainerStatuses"]}
        assert inits == {"lora-download-0": 0, "lora-download-1": 0}, inits
        answers = {name: run_in_pod(stack, ASK_CAPITAL, base_url, name) for name in ADAPTERS}
        base = run_in_pod(stack, ASK_CAPITAL, base_url)
    finally:
        k("delete", "rsvc", NAME, "-n", ns, "--ignore-not-found", "--timeout=180s", timeout=240)
    for name, answer in answers.items():
        assert answer["model"] == name, answer
        text = answer["choices"][0]["message"]["content"]
        assert text != base["choices"][0]["message"]["content"], f"{name} answered as the base model"
    assert "paris" in base["choices"][0]["message"]["content"].lower(), base
