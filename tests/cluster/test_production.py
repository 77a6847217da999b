"""Production features on a real control plane: the partial pod template merged into
the Deployment, the disruption budget, preStop and spread, the HPA on the InferenceService's scale
subresource, the KEDA path without KEDA installed, and the new CEL rules judged by the API server."""

from __future__ import annotations

import pytest

from tests.cluster.scenario import (
    Stack,
    apply,
    condition,
    delete_and_wait,
    get,
    gpu_spec,
    rsvc,
    try_apply,
    wait_ready,
)
from tests.e2e.kind_cluster import wait_for

pytestmark = pytest.mark.cluster
OWNER = ("InferenceService", True)

TEMPLATE = {
    "metadata": {"labels": {"team": "ml"}},
    "spec": {
        "nodeSelector": {"kubernetes.io/hostname": "gpu-node-1"},
        "priorityClassName": "radixserve-test",
        "imagePullSecrets": [{"name": "regcred"}],
        "volumes": [
            {"name": "extra", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}},  # replaces the operator's
        ],
        "container": {
            "volumeMounts": [{"name": "extra", "mountPath": "/extra", "readOnly": True}],
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "HOME", "value": "/extra"}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}},
        },
    },
}


def _owned(obj: dict) -> bool:
    return [(r["kind"], r.get("controller")) for r in obj["metadata"]["ownerReferences"]] == [OWNER]


def _gone(stack: Stack, namespace: str, kind: str, name: str, timeout: float = 60) -> None:
    wait_for(
        f"{kind} {name} deleted", lambda: get(stack, namespace, kind, name) is None, timeout, 1
    )


def test_template_merged_pdb_hpa_and_their_removal(stack: Stack, namespace: str) -> None:
    name = "prod"
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "radixserve-test"}, "value": 1000}  # fmt: skip
    apply(stack, namespace, priority)
    spec = gpu_spec(
        1, 2, template=TEMPLATE, autoscaling={"minReplicas": 2, "maxReplicas": 4, "target": 8}
    )
    apply(stack, namespace, rsvc(name, spec))
    wait_ready(stack, namespace, name, 2)

    dep = get(stack, namespace, "deployment", name)
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert dep["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-1"}
    assert pod["priorityClassName"] == "radixserve-test"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["tmp"]["emptyDir"] == {"sizeLimit": "16Gi"} and "extra" in vols
    assert {"name": "extra", "mountPath": "/extra", "readOnly": True} in c["volumeMounts"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["HOME"] == "/extra"
    assert c["resources"]["requests"]["cpu"] == "2" and c["resources"]["limits"]["memory"] == "8Gi"
    assert c["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert pod["terminationGracePeriodSeconds"] == 5 + 30 + 15
    (spread,) = pod["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["whenUnsatisfiable"]) == (
        "kubernetes.io/hostname",
        "ScheduleAnyway",
    )
    # the scheduler honoured the merged nodeSelector
    pods = stack.kubectl.json(
        "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}"
    )
    assert {p["spec"]["nodeName"] for p in pods["items"]} == {"gpu-node-1"}

    pdb = get(stack, namespace, "pdb", name)
    assert _owned(pdb) and pdb["spec"]["maxUnavailable"] == 1
    wait_for(
        "the disruption controller to count the PDB's pods",
        lambda: (
            (get(stack, namespace, "pdb", name) or {}).get("status", {}).get("expectedPods") == 2
        ),
        60,
        1,
    )

    hpa = get(stack, namespace, "hpa", name)
    assert _owned(hpa)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "radixserve.dev/v1alpha1",
        "kind": "InferenceService",
        "name": name,
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "radixserve_requests_in_flight"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "8"}

    def able_to_scale() -> dict | None:
        got = get(stack, namespace, "hpa", name) or {}
        conds = {c["type"]: c for c in got.get("status", {}).get("conditions", [])}
        return (
            conds.get("AbleToScale")
            if conds.get("AbleToScale", {}).get("status") == "True"
            else None
        )

    # the HPA controller reads the InferenceService's scale subresource (no metrics API here)
    assert (
        wait_for("the HPA to read the scale", able_to_scale, 90, 2)["reason"] == "SucceededGetScale"
    )
    obj = get(stack, namespace, "rsvc", name)
    assert condition(obj, "Autoscaling")["status"] == "True"
    assert condition(obj, "Autoscaling")["reason"] == "HorizontalPodAutoscalerApplied"

    # the user removes autoscaling and goes to one replica: the operator deletes the HPA and PDB
    stack.kubectl(
        "patch", "rsvc", name, "-n", namespace, "--type", "json", "-p",
        '[{"op": "remove", "path": "/spec/autoscaling"}, {"op": "replace", "path": "/spec/replicas", "value": 1}]',
    )  # fmt: skip
    _gone(stack, namespace, "hpa", name)
    _gone(stack, namespace, "pdb", name)
    obj = wait_ready(stack, namespace, name, 1)
    assert condition(obj, "Autoscaling") == {}
    delete_and_wait(stack, namespace, name)


def test_keda_without_keda_installed_says_so(stack: Stack, namespace: str) -> None:
    name = "keda"
    spec = gpu_spec(1, 1, autoscaling={"engine": "keda", "minReplicas": 0, "maxReplicas": 2})
    apply(stack, namespace, rsvc(name, spec))
    obj = wait_ready(stack, namespace, name, 1)  # it serves anyway

    def scaler_condition() -> dict | None:
        c = condition(get(stack, namespace, "rsvc", name), "Autoscaling")
        return c if c.get("status") == "False" else None

    c = wait_for("the Autoscaling condition", scaler_condition, 60, 1)
    assert c["reason"] == "KEDANotInstalled" and "install KEDA" in c["message"], c
    events = stack.kubectl(
        "get", "events", "-n", namespace, "--field-selector",
        f"involvedObject.name={name},reason=KEDANotInstalled", "-o", "jsonpath={.items[*].message}",
    )  # fmt: skip
    assert "install KEDA" in events
    assert condition(obj, "Ready")["status"] == "True"
    assert stack.operator.alive()
    delete_and_wait(stack, namespace, name)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"template": {"spec": {"container": {"args": ["serve"]}}}},
            "the server's command and args are the operator's",
        ),
        (
            {"template": {"spec": {"container": {"resources": {"limits": {"nvidia.com/gpu": 4}}}}}},
            "the GPU count is the operator's",
        ),
        ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas must not exceed"),
        ({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}, "needs engine keda"),
        (
            {"autoscaling": {"maxReplicas": 2, "metric": "kvCache", "target": 80}},
            "a kvCache target is a ratio",
        ),
    ],
    ids=["command", "gpu-count", "min-over-max", "zero-with-hpa", "kv-target"],
)
def test_api_server_refuses_what_would_break_the_runtime(
    stack: Stack, namespace: str, spec: dict, message: str
) -> None:
    accepted, out = try_apply(stack, namespace, rsvc("refused", gpu_spec(1, **spec)))
    assert not accepted and message in out, out


def test_api_server_accepts_the_full_shape(stack: Stack, namespace: str) -> None:
    """Every new field at once (kvCache as an integer target too: CEL compares it as a number)."""
    spec = gpu_spec(
        1,
        0,
        template={
            "spec": {
                **TEMPLATE["spec"],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"podAntiAffinity": {}},
                "topologySpreadConstraints": [],
                "runtimeClassName": "nvidia",
                "serviceAccountName": "default",
            }
        },
        disruptionBudget={"enabled": False, "maxUnavailable": "50%"},
        autoscaling={"engine": "keda", "minReplicas": 0, "maxReplicas": 3, "metric": "kvCache",
                     "target": 1, "prometheus": {"serverAddress": "http://prom:9090", "query": "sum(up)"}},
        runtime={"preStopSeconds": 0},
    )  # fmt: skip
    accepted, out = try_apply(stack, namespace, rsvc("full", spec))
    assert accepted, out
    stack.kubectl("delete", "rsvc", "full", "-n", namespace)
