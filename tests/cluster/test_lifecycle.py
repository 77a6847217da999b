"""An InferenceService's life as a user lives it, on a real control plane: apply the sample, wait
for Ready, scale (by hand and through an HPA), roll out a spec change in place (opted in), lose
and regain children, delete. Tests run in order; the sample lives through the module."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.cluster.scenario import (
    REPO,
    Stack,
    apply,
    children,
    condition,
    delete_and_wait,
    get,
    gpu_spec,
    live_pods,
    ready_after,
    rsvc,
    wait_ready,
)
from tests.e2e.kind_cluster import wait_for

pytestmark = pytest.mark.cluster
SAMPLE = REPO / "manifests" / "samples" / "inferenceservice-cpu.yaml"
NAME = yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]


def _events(stack: Stack, namespace: str, name: str) -> list[str]:
    out = stack.kubectl(
        "get", "events", "-n", namespace,
        "--field-selector", f"involvedObject.name={name},involvedObject.kind=InferenceService",
        "-o", "jsonpath={.items[*].reason}",
    )  # fmt: skip
    return out.split()


def test_sample_becomes_ready_and_kubectl_wait_returns(stack: Stack, namespace: str) -> None:
    stack.kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    # kubectl wait is what users script against: it must return, not hang on a stale status
    stack.kubectl("wait", "--for=condition=Ready", f"rsvc/{NAME}", "-n", namespace,
                  "--timeout=90s", timeout=120)  # fmt: skip
    obj = wait_ready(stack, namespace, NAME, 1)
    owner = obj["metadata"]["uid"]
    for kind in ("deployment", "service"):
        [child] = children(stack, namespace, NAME, kind + "s")
        refs = child["metadata"]["ownerReferences"]
        assert [(r["kind"], r["uid"], r.get("controller")) for r in refs] == [
            ("InferenceService", owner, True)
        ]
    st = obj["status"]
    assert st["endpoint"] == f"http://{NAME}.{namespace}.svc:8000/v1"
    assert (st["tensorParallelSize"], st["gpusPerReplica"]) == (1, 0)
    assert condition(obj, "Degraded")["status"] == "False"
    assert {"Created", "RolloutComplete"} <= set(_events(stack, namespace, NAME))


def test_kubectl_scale_and_an_hpa_drive_the_replicas(stack: Stack, namespace: str) -> None:
    stack.kubectl("scale", f"rsvc/{NAME}", "-n", namespace, "--replicas=3")
    obj = wait_ready(stack, namespace, NAME, 3)
    [deployment] = children(stack, namespace, NAME, "deployments")
    assert deployment["spec"]["replicas"] == 3 and len(live_pods(stack, namespace, NAME)) == 3
    scale = json.loads(
        stack.kubectl(
            "get", "--raw",
            f"/apis/radixserve.dev/v1alpha1/namespaces/{namespace}/inferenceservices/{NAME}/scale",
        )
    )  # fmt: skip
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == obj["status"]["selector"]

    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": NAME},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "radixserve.dev/v1alpha1",
                "kind": "InferenceService",
                "name": NAME,
            },
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }
    apply(stack, namespace, hpa)

    def able_to_scale() -> dict | None:
        got = stack.kubectl.get("hpa", NAME, namespace) or {}
        conds = {c["type"]: c for c in got.get("status", {}).get("conditions", [])}
        return conds.get("AbleToScale") if conds.get("AbleToScale", {}).get("status") == "True" else None

    # The HPA controller read the scale subresource (no metrics server here, so it cannot act)
    cond = wait_for("the HPA to read the InferenceService's scale", able_to_scale, 90, 2)
    assert cond["reason"] == "SucceededGetScale", cond
    assert (stack.kubectl.get("hpa", NAME, namespace) or {})["status"]["currentReplicas"] == 3
    stack.kubectl("delete", "hpa", NAME, "-n", namespace)


def test_spec_change_rolls_out_in_place_when_the_spec_opts_in(stack: Stack, namespace: str) -> None:
    """rollout.maxSurge 0: no surge pod, no GPU beyond the replicas' (the default surges:
    test_rollout.py)."""
    name, replicas = "roll", 3
    spec = gpu_spec(2, replicas, template={"metadata": {"annotations": ready_after(1500)}},
                    rollout={"maxSurge": 0})
    apply(stack, namespace, rsvc(name, spec))
    wait_ready(stack, namespace, name, replicas)
    stack.kubectl("patch", "rsvc", name, "-n", namespace, "--type=merge",
                  "-p", json.dumps({"spec": {"runtime": {"maxRunningRequests": 8}}}))  # fmt: skip

    most_pods, most_gpus, reasons = 0, 0, []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = live_pods(stack, namespace, name)
        most_pods = max(most_pods, len(pods))
        gpus = sum(int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) for p in pods)
        most_gpus = max(most_gpus, gpus)
        obj = get(stack, namespace, "rsvc", name)
        ready = condition(obj)
        reasons.append(ready.get("reason"))
        if ready.get("status") == "True" and ready.get("observedGeneration") == 2:
            break
        time.sleep(0.3)
    obj = wait_ready(stack, namespace, name, replicas)
    assert obj["metadata"]["generation"] == 2
    assert "RollingOut" in reasons, reasons  # seen while the new pods came up
    assert most_pods <= replicas and most_gpus <= 2 * replicas, (most_pods, most_gpus)
    sets = children(stack, namespace, name, "replicasets")
    by_args = {
        "--max-running-requests" in rs["spec"]["template"]["spec"]["containers"][0]["args"]: rs
        for rs in sets
    }
    assert len(sets) == 2 and by_args[True]["spec"]["replicas"] == replicas
    assert by_args[False]["spec"]["replicas"] == 0
    for pod in live_pods(stack, namespace, name):  # Ready means no pod of the old spec serves
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--max-running-requests") + 1] == "8"
    delete_and_wait(stack, namespace, name)


def test_lost_or_edited_children_are_restored(stack: Stack, namespace: str) -> None:
    [service] = children(stack, namespace, NAME, "services")
    stack.kubectl("delete", "service", NAME, "-n", namespace)
    restored = wait_for(
        "the Service to be recreated",
        lambda: [s for s in children(stack, namespace, NAME, "services")
                 if s["metadata"]["uid"] != service["metadata"]["uid"]],
        60,
    )  # fmt: skip
    assert restored[0]["spec"]["ports"][0]["port"] == 8000

    stack.kubectl("scale", "deployment", NAME, "-n", namespace, "--replicas=5")
    wait_for(
        "the hand-scaled Deployment to return to the owner's 3 replicas",
        lambda: children(stack, namespace, NAME, "deployments")[0]["spec"]["replicas"] == 3,
        60,
    )
    [deployment] = children(stack, namespace, NAME, "deployments")
    stack.kubectl("delete", "deployment", NAME, "-n", namespace)
    wait_for(
        "the Deployment to be recreated",
        lambda: [d for d in children(stack, namespace, NAME, "deployments")
                 if d["metadata"]["uid"] != deployment["metadata"]["uid"]],
        60,
    )  # fmt: skip
    wait_ready(stack, namespace, NAME, 3)


def test_delete_takes_the_children_with_it(stack: Stack, namespace: str) -> None:
    delete_and_wait(stack, namespace, NAME)  # the garbage collector, by owner references
    assert stack.kubectl.get("rsvc", NAME, namespace) is None
