"""What goes wrong in a GPU cluster, and what the status says about it: not enough GPUs (the real
scheduler's verdict), a crash-looping or never-ready pod (KWOK plays the kubelet), env that
collides with the operator's, and a model whose hub cannot be reached."""

from __future__ import annotations

import json

import pytest

from tests.cluster.scenario import (
    CRASHLOOP,
    NEVER_READY,
    Stack,
    apply,
    children,
    condition,
    cpu_spec,
    delete_and_wait,
    get,
    gpu_spec,
    live_pods,
    rsvc,
    wait_ready,
    wait_reason,
)
from tests.e2e.kind_cluster import wait_for

pytestmark = pytest.mark.cluster


def test_more_gpus_than_the_nodes_have_is_insufficient_gpu(stack: Stack, namespace: str) -> None:
    name = "big"  # TP 8 x 3 replicas = 24 GPUs; the two GPU nodes have 8 each
    apply(stack, namespace, rsvc(name, gpu_spec(8, 3)))
    obj = wait_reason(stack, namespace, name, "InsufficientGPU")
    message = condition(obj)["message"]
    assert "Insufficient nvidia.com/gpu" in message, message  # the scheduler's own words
    assert condition(obj, "Degraded")["status"] == "True"
    pending = [p for p in live_pods(stack, namespace, name) if p["status"]["phase"] == "Pending"]
    assert len(pending) == 1

    stack.kubectl("scale", f"rsvc/{name}", "-n", namespace, "--replicas=2")  # capacity suffices
    obj = wait_ready(stack, namespace, name, 2)
    assert condition(obj, "Degraded")["status"] == "False"
    delete_and_wait(stack, namespace, name)


def test_crash_looping_pod_is_reported_with_its_reason(stack: Stack, namespace: str) -> None:
    name = "crashy"
    apply(stack, namespace, rsvc(name, cpu_spec(template={"metadata": {"annotations": CRASHLOOP}})))
    obj = wait_reason(stack, namespace, name, "CrashLoopBackOff", timeout=30)
    message = condition(obj)["message"]
    [pod] = live_pods(stack, namespace, name)
    assert message.startswith(pod["metadata"]["name"] + ": CrashLoopBackOff"), message
    assert "last exit: Error, code 1" in message, message
    assert condition(obj, "Degraded")["status"] == "True"

    # the fix rolls out and clears it
    patch = {"spec": {"template": {"metadata": {"annotations": None}}}}
    stack.kubectl("patch", "rsvc", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    wait_ready(stack, namespace, name, 1)
    delete_and_wait(stack, namespace, name)


def test_never_ready_pod_is_named_in_the_rollout_message(stack: Stack, namespace: str) -> None:
    name = "sleepy"
    apply(stack, namespace, rsvc(name, cpu_spec(template={"metadata": {"annotations": NEVER_READY}})))
    wait_reason(stack, namespace, name, "RollingOut", timeout=30)

    def says_not_ready() -> dict | None:
        got = get(stack, namespace, "rsvc", name)
        return got if "not ready" in condition(got).get("message", "").lower() or (
            "unready" in condition(got).get("message", "")) else None

    obj = wait_for("the rollout message to name the unready pod", says_not_ready, 30, 0.5)
    [pod] = live_pods(stack, namespace, name)
    assert pod["metadata"]["name"] in condition(obj)["message"]
    delete_and_wait(stack, namespace, name)


def test_env_naming_what_the_operator_sets_is_merged(stack: Stack, namespace: str) -> None:
    name = "envy"
    env = [
        {"name": "HF_HOME", "value": "/data/hf"},
        {"name": "RADIXSERVE_CACHE_DIR", "value": "/data/cache"},
        {"name": "MY_FLAG", "value": "on"},
    ]
    apply(stack, namespace, rsvc(name, cpu_spec(env=env)))
    wait_ready(stack, namespace, name, 1)  # no retry loop of HTTP 500 from server-side apply
    [deployment] = children(stack, namespace, name, "deployments")
    got = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in got]
    assert len(names) == len(set(names)), names
    values = {e["name"]: e.get("value") for e in got}
    assert values["HF_HOME"] == "/data/hf" and values["RADIXSERVE_CACHE_DIR"] == "/data/cache"
    assert values["MY_FLAG"] == "on" and values["HOME"] == "/tmp"
    delete_and_wait(stack, namespace, name)


def test_air_gapped_model_deploys_with_tp_and_says_why_without(stack: Stack, namespace: str) -> None:
    # The operator's hub is unreachable (tests/cluster/operator_process.py): with TP given, the
    # model deploys; its TP is trusted, and an event says it could not be checked.
    apply(stack, namespace, rsvc("offline-tp", gpu_spec(2)))
    obj = wait_ready(stack, namespace, "offline-tp", 1)
    assert obj["status"]["tensorParallelSize"] == 2 and obj["status"]["gpusPerReplica"] == 2

    def reasons() -> list[str] | None:  # kopf posts events asynchronously: Ready may come first
        out = stack.kubectl("get", "events", "-n", namespace, "--field-selector",
                            "involvedObject.name=offline-tp", "-o", "jsonpath={.items[*].reason}")  # fmt: skip
        return out.split() if "TPUnchecked" in out.split() else None

    wait_for("the TPUnchecked event", reasons, 30, 0.5)

    auto = gpu_spec(1, parallelism={"tensor": "auto"}, gpu={"memoryGiB": 80})
    apply(stack, namespace, rsvc("offline-auto", auto))
    obj = wait_reason(stack, namespace, "offline-auto", "ModelConfigUnavailable", timeout=60)
    message = condition(obj)["message"]
    assert "Qwen/Qwen3-0.6B" in message and "spec.parallelism.tensor" in message, message
    assert condition(obj, "Degraded")["status"] == "True"
    assert children(stack, namespace, "offline-auto", "deployments") == []
    for name in ("offline-tp", "offline-auto"):
        delete_and_wait(stack, namespace, name)
