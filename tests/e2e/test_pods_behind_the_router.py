"""Real pods behind the cache-aware router: an InferenceService with `spec.router.enabled` and two
replicas gets a gateway pod (the router image, `smg`) that discovers the replicas by label and
answers in-cluster like a single server; a rolling update and a scale-down under a client loop
through the gateway lose no request. Runs before the real-pod suite's uninstall (file order)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.e2e.client_loop import ClientLoop
from tests.e2e.conftest import REPO, RUNTIME_CPU_IMAGE, Stack
from tests.e2e.in_cluster import ASK_CAPITAL, run_in_pod
from tests.e2e.kind_cluster import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(3600)]

SAMPLE = REPO / "manifests" / "samples" / "inferenceservice-cpu.yaml"
NAME = "smollm2-routed"
ROUTER = f"{NAME}-router"
READY_TIMEOUT = 900

# the gateway's worker list (its own API, at its root)
WORKERS = """
import json, sys, urllib.request
url = sys.argv[1].removesuffix("/v1") + "/workers"
print(json.dumps({"workers": urllib.request.urlopen(url, timeout=60).read().decode()}))
"""


def _spec() -> dict:
    sample = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"]["name"] = NAME
    spec = sample["spec"]
    spec["replicas"] = 2
    spec["resources"]["requests"] = {"cpu": "250m", "memory": "1Gi"}
    # no spec.rollout: the default surges first, so no replica is missing while one rolls
    spec["router"] = {"enabled": True, "policy": "cache_aware",
                      "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                    "limits": {"memory": "1Gi"}}}
    return sample


def _wait_ready(stack: Stack, replicas: int) -> dict:
    def probe() -> dict | None:
        obj = stack.kubectl.get("rsvc", NAME, stack.serving_ns) or {}
        st, gen = obj.get("status", {}), obj.get("metadata", {}).get("generation")
        ready = next((c for c in st.get("conditions", []) if c["type"] == "Ready"), {})
        router = stack.kubectl.get("deployment", ROUTER, stack.serving_ns) or {}
        done = (ready.get("status") == "True" and ready.get("observedGeneration") == gen
                and st.get("readyReplicas") == replicas
                and router.get("status", {}).get("readyReplicas") == 1)
        return obj if done else None

    return wait_for(f"{NAME} Ready with {replicas} replicas and its router", probe, READY_TIMEOUT,
                    interval=3)


def _server_pods(stack: Stack) -> list[dict]:
    # the servers' own selector: the router's pods share the instance label, not the name
    pods = stack.kubectl.json("get", "pods", "-n", stack.serving_ns, "-l",
                              f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name=radixserve")
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def test_the_router_discovers_the_replicas_and_answers_in_cluster(stack: Stack) -> None:
    stack.kubectl("apply", "-n", stack.serving_ns, "-f", "-", input=yaml.safe_dump(_spec()))
    obj = _wait_ready(stack, replicas=2)
    endpoint = obj["status"]["endpoint"]
    assert endpoint == f"http://{ROUTER}.{stack.serving_ns}.svc:8000/v1"
    assert len(_server_pods(stack)) == 2
    answer = run_in_pod(stack, ASK_CAPITAL, endpoint)
    workers = run_in_pod(stack, WORKERS, endpoint)["workers"]
    assert "paris" in answer["choices"][0]["message"]["content"].lower(), answer
    # the gateway lists both replicas' pod addresses as its workers
    for pod in _server_pods(stack):
        assert f"{pod['status']['podIP']}:8000" in workers, workers


def test_rollout_and_scale_down_through_the_router_lose_no_request(stack: Stack) -> None:
    client = ClientLoop(stack.kubectl, stack.serving_ns, RUNTIME_CPU_IMAGE,
                        f"http://{ROUTER}.{stack.serving_ns}.svc:8000/v1")
    try:
        client.wait_ok(3)
        stack.kubectl("patch", "rsvc", NAME, "-n", stack.serving_ns, "--type=merge", "-p",
                      json.dumps({"spec": {"runtime": {"maxRunningRequests": 8}}}))
        _wait_ready(stack, replicas=2)
        client.wait_ok(client.ok_seen() + 3)
        stack.kubectl("scale", f"rsvc/{NAME}", "-n", stack.serving_ns, "--replicas=1")
        _wait_ready(stack, replicas=1)
        wait_for("one server pod left", lambda: len(_server_pods(stack)) == 1, timeout=300,
                 interval=3)
        client.wait_ok(client.ok_seen() + 3)
    finally:
        tally = client.stop()
    print(f"client loop through the router: {tally['ok']} answered, {tally['failed']} failed")
    assert tally["failed"] == 0, tally["errors"]
    for pod in _server_pods(stack):
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--max-running-requests") + 1] == "8"


def test_deleting_it_removes_the_router_too(stack: Stack) -> None:
    stack.kubectl("delete", "rsvc", NAME, "-n", stack.serving_ns, "--timeout=180s")

    def left() -> str:
        return stack.kubectl("get", "deployments,services,pods,serviceaccounts,roles,rolebindings",
                             "-n", stack.serving_ns, "-l", f"app.kubernetes.io/instance={NAME}",
                             "-o", "name").strip()

    wait_for(f"children of {NAME} (router included) garbage-collected", lambda: left() == "",
             timeout=300, interval=3)
