"""The default rollout on a real control plane: a one-replica service surges first and never has
no ready replica; where no node has room for the surge pod (the real scheduler's verdict), the
previous pod keeps serving and the status and a Warning event say SurgeBlocked, until capacity
comes (here: the spec opts in to replacing in place)."""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster.scenario import (
    Stack,
    apply,
    condition,
    delete_and_wait,
    get,
    gpu_spec,
    live_pods,
    ready_after,
    rsvc,
    wait_ready,
    wait_reason,
)
from tests.e2e.kind_cluster import wait_for

pytestmark = pytest.mark.cluster
ON_ONE_NODE = {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-0"}}  # 8 GPUs


def _patch(stack: Stack, namespace: str, name: str, spec: dict) -> None:
    stack.kubectl("patch", "rsvc", name, "-n", namespace, "--type=merge",
                  "-p", json.dumps({"spec": spec}))  # fmt: skip


def _ready_pods(stack: Stack, namespace: str, name: str) -> int:
    return sum(
        1
        for p in live_pods(stack, namespace, name)
        for c in (p.get("status") or {}).get("conditions") or ()
        if c["type"] == "Ready" and c["status"] == "True"
    )


def test_default_rollout_of_one_replica_keeps_a_ready_pod(stack: Stack, namespace: str) -> None:
    name = "surge"
    spec = gpu_spec(1, 1, template={"metadata": {"annotations": ready_after(1500)}})
    apply(stack, namespace, rsvc(name, spec))
    wait_ready(stack, namespace, name, 1)
    deployment = stack.kubectl.get("deployment", name, namespace)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    _patch(stack, namespace, name, {"runtime": {"maxRunningRequests": 8}})

    fewest_ready, most_pods = 1, 1
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        fewest_ready = min(fewest_ready, _ready_pods(stack, namespace, name))
        most_pods = max(most_pods, len(live_pods(stack, namespace, name)))
        ready = condition(get(stack, namespace, "rsvc", name))
        if ready.get("status") == "True" and ready.get("observedGeneration") == 2:
            break
        time.sleep(0.2)
    wait_ready(stack, namespace, name, 1)
    assert most_pods == 2, most_pods  # the new pod came up beside the old one
    assert fewest_ready == 1  # and the old one served until it was ready
    delete_and_wait(stack, namespace, name)


def test_a_surge_pod_with_no_room_is_reported_and_waited_for(stack: Stack, namespace: str) -> None:
    name = "full"  # TP 8 on a node of 8 GPUs: no room for a second pod there
    apply(stack, namespace, rsvc(name, gpu_spec(8, 1, **ON_ONE_NODE)))
    wait_ready(stack, namespace, name, 1)
    (old,) = live_pods(stack, namespace, name)
    _patch(stack, namespace, name, {"runtime": {"maxRunningRequests": 8}})

    obj = wait_reason(stack, namespace, name, "SurgeBlocked", timeout=90)
    message = condition(obj)["message"]
    assert "Insufficient nvidia.com/gpu" in message, message  # the scheduler's words
    assert "spec.rollout.maxSurge: 0" in message, message  # and how to opt in
    assert condition(obj, "Degraded")["status"] == "True"
    events = stack.kubectl.json(
        "get", "events", "-n", namespace,
        "--field-selector", f"involvedObject.name={name},reason=SurgeBlocked",
    )["items"]  # fmt: skip
    assert events and events[0]["type"] == "Warning"
    time.sleep(5)  # it waits: the old pod stays, ready
    assert old["metadata"]["name"] in {p["metadata"]["name"] for p in live_pods(stack, namespace, name)}
    assert _ready_pods(stack, namespace, name) == 1

    _patch(stack, namespace, name, {"rollout": {"maxSurge": 0}})  # opting in: replaced in place
    obj = wait_ready(stack, namespace, name, 1, timeout=120)
    assert obj["metadata"]["generation"] == 3
    wait_for("the old pod gone", lambda: all(
        p["metadata"]["name"] != old["metadata"]["name"] for p in live_pods(stack, namespace, name)
    ), 60, 1)
    delete_and_wait(stack, namespace, name)


def test_a_spec_that_opts_in_falls_back_to_in_place(stack: Stack, namespace: str) -> None:
    name = "fallback"
    spec = gpu_spec(8, 1, rollout={"whenSurgeBlocked": "ReplaceInPlace"}, **ON_ONE_NODE)
    apply(stack, namespace, rsvc(name, spec))
    wait_ready(stack, namespace, name, 1)
    (old,) = live_pods(stack, namespace, name)
    _patch(stack, namespace, name, {"runtime": {"maxRunningRequests": 8}})
    obj = wait_ready(stack, namespace, name, 1, timeout=120)  # no one had to step in
    assert obj["metadata"]["generation"] == 2
    assert old["metadata"]["name"] not in {p["metadata"]["name"] for p in live_pods(stack, namespace, name)}
    reasons = stack.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}",
        "-o", "jsonpath={.items[*].reason}",
    ).split()  # fmt: skip
    assert "SurgeBlocked" in reasons and "ReplacingInPlace" in reasons, reasons
    deployment = stack.kubectl.get("deployment", name, namespace)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    delete_and_wait(stack, namespace, name)
