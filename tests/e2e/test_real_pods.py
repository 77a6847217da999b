"""Real pods: the chart's operator (a pod) serves the CPU sample (embedded model, TP 1) in real
containers; it answers an OpenAI chat call by its Service's DNS name from another pod, streamed or
not, and through `kubectl port-forward`; `kubectl logs` shows the access lines and `helm test`
passes; it rolls out a spec change and scales up and down under a client loop without a failed
request, converges when the operator pod is killed mid-rollout, comes back when its server process
dies, cleans up its children on delete, schedules a GPU replica on fake GPU capacity, and
`helm uninstall` with a resource present leaves nothing Terminating. Tests run in order and share
one InferenceService. On kind (`make e2e`) or on the real node of `make cluster`
(`make node-test`)."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request

import pytest
import yaml

from tests.e2e.client_loop import ClientLoop
from tests.e2e.conftest import REPO, RUNTIME_CPU_IMAGE, Stack
from tests.e2e.in_cluster import ASK_CAPITAL, run_in_pod
from tests.e2e.kind_cluster import wait_for

# The first test also waits for the stack: image builds and imports (minutes on a cold cache).
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(3600)]

SAMPLE = REPO / "manifests" / "samples" / "inferenceservice-cpu.yaml"
NAME = yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]
READY_TIMEOUT = 900  # image already loaded; this is model load + probes on a slow laptop

# SIGKILL every process of the server in the container (not this one).
KILL_SERVER = (
    "import os, signal\n"
    "for p in filter(str.isdigit, os.listdir('/proc')):\n"
    "    if int(p) != os.getpid() and b'radixserve' in open(f'/proc/{p}/cmdline', 'rb').read():\n"
    "        os.kill(int(p), signal.SIGKILL)\n"
)


# The same question streamed: each server-sent event's delta, and whether [DONE] ended the stream.
STREAM_SCRIPT = """
import json, sys, urllib.request
base = sys.argv[1]
model = json.load(urllib.request.urlopen(base + "/models", timeout=60))["data"][0]["id"]
body = {"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24, "temperature": 0, "stream": True}
req = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
deltas, done = [], False
with urllib.request.urlopen(req, timeout=300) as r:
    content_type = r.headers["Content-Type"]
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        assert not done, "an event after [DONE]"
        for choice in json.loads(line[len("data: "):])["choices"]:
            deltas.append(choice["delta"].get("content") or "")
print(json.dumps({"content_type": content_type, "deltas": deltas, "done": done}))
"""


def _rsvc(stack: Stack) -> dict:
    obj = stack.kubectl.get("rsvc", NAME, stack.serving_ns)
    assert obj is not None, f"InferenceService {NAME} is gone"
    return obj


def _ready(obj: dict) -> dict | None:
    return next(
        (c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Ready"), None
    )


def _wait_ready_at_current_generation(stack: Stack, replicas: int) -> dict:
    """Ready=True for the resource's latest generation, with every replica ready."""
    seen: list[str] = []

    def probe() -> dict | None:
        obj = _rsvc(stack)
        gen, st, ready = obj["metadata"]["generation"], obj.get("status", {}), _ready(obj) or {}
        seen.append(
            f"gen {gen}: Ready={ready.get('status')}/{ready.get('reason')} "
            f"observed={st.get('observedGeneration')} ready={st.get('readyReplicas')}"
        )
        done = (
            ready.get("status") == "True"
            and ready.get("observedGeneration") == gen
            and st.get("observedGeneration") == gen
            and st.get("readyReplicas") == replicas
        )
        return obj if done else None

    try:
        return wait_for(f"{NAME} Ready", probe, READY_TIMEOUT, interval=3)
    finally:
        print("\n".join(dict.fromkeys(seen)))  # each distinct state once: the rollout as it went


def _pod_args(stack: Stack) -> list[list[str]]:
    pods = stack.kubectl.json(
        "get", "pods", "-n", stack.serving_ns, "-l", f"app.kubernetes.io/instance={NAME}"
    )
    live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    return [p["spec"]["containers"][0]["args"] for p in live]


def _chat_in_cluster(stack: Stack, base_url: str, script: str = ASK_CAPITAL) -> dict:
    return run_in_pod(stack, script, base_url)


def test_cpu_sample_becomes_ready_and_answers_in_cluster(stack: Stack) -> None:
    stack.kubectl("apply", "-n", stack.serving_ns, "-f", str(SAMPLE))
    obj = _wait_ready_at_current_generation(stack, replicas=1)
    endpoint = obj["status"]["endpoint"]
    assert endpoint == f"http://{NAME}.{stack.serving_ns}.svc:8000/v1"
    assert obj["status"]["tensorParallelSize"] == 1 and obj["status"]["gpusPerReplica"] == 0

    answer = _chat_in_cluster(stack, endpoint)
    message = answer["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert "paris" in message["content"].lower(), message  # greedy SmolLM2-135M knows this one
    assert answer["usage"]["completion_tokens"] > 0

    reasons = stack.kubectl(
        "get",
        "events",
        "-n",
        stack.serving_ns,
        "--field-selector",
        f"involvedObject.name={NAME},involvedObject.kind=InferenceService",
        "-o",
        "jsonpath={.items[*].reason}",
    ).split()
    assert "Created" in reasons, reasons


def test_a_streamed_answer_arrives_in_pieces_through_the_service(stack: Stack) -> None:
    reply = _chat_in_cluster(stack, f"http://{NAME}.{stack.serving_ns}.svc:8000/v1", STREAM_SCRIPT)
    assert reply["content_type"].startswith("text/event-stream"), reply
    assert reply["done"], "the stream did not end with [DONE]"
    assert sum(1 for d in reply["deltas"] if d) > 1, reply  # pieces, not one block
    assert "paris" in "".join(reply["deltas"]).lower(), reply


def test_kubectl_port_forward_answers(stack: Stack) -> None:
    k = stack.kubectl
    forward = subprocess.Popen(
        [k.binary, f"--kubeconfig={k.kubeconfig}", "port-forward", "-n", stack.serving_ns,
         f"svc/{NAME}", ":8000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8000"
        found = re.search(r"127\.0\.0\.1:(\d+)", first)
        assert found, f"port-forward said {first!r}; stderr {forward.stderr.read() if forward.poll() is not None else ''}"
        base = f"http://127.0.0.1:{found.group(1)}/v1"
        model = json.load(urllib.request.urlopen(base + "/models", timeout=60))["data"][0]["id"]
        body = {"model": model, "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        req = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(req, timeout=300))
    finally:
        forward.terminate()
        forward.wait(timeout=30)
    assert "paris" in answer["choices"][0]["message"]["content"].lower(), answer


def test_kubectl_logs_show_the_access_lines(stack: Stack) -> None:
    logs = stack.kubectl("logs", "-n", stack.serving_ns, "-l", f"app.kubernetes.io/instance={NAME}",
                         "-c", "server", "--tail=-1")
    # the calls of the tests above: in-cluster, streamed, and through the port-forward
    lines = [ln for ln in logs.splitlines() if "POST /v1/chat/completions 200" in ln]
    assert len(lines) >= 3, logs[-3000:]
    assert "GET /v1/models 200" in logs


def test_helm_test_runs_the_charts_test_pod(stack: Stack) -> None:
    """`helm test` passes against the served resource and fails against a missing one."""
    import helm_python as helm
    from scripts.cluster.deploy import CHART, RELEASE

    from tests.e2e.conftest import OPERATOR_VALUES

    def helm_test(target: str) -> None:
        values = OPERATOR_VALUES | {"test": {"inferenceService": target,
                                             "namespace": stack.serving_ns, "timeoutSeconds": 20}}
        with helm.Config(kubeconfig_path=str(stack.kubeconfig), namespace=stack.operator_ns) as cfg:
            cfg.upgrade(str(CHART), RELEASE, values, namespace=stack.operator_ns, wait="watcher",
                        timeout=300)
            # NOTE: no `logs=True`: Helm reads test pods' logs in the release's namespace, and
            # this pod runs in the resource's
            cfg.test(RELEASE, timeout=300)  # a failed test pod raises

    helm_test(NAME)
    pod = stack.kubectl.get("pod", f"radixserve-test-{NAME}", stack.serving_ns)
    if pod is not None:  # kept until the next run (hook-delete-policy before-hook-creation)
        assert pod["status"]["phase"] == "Succeeded"
        logs = stack.kubectl("logs", f"radixserve-test-{NAME}", "-n", stack.serving_ns)
        assert "completion:" in logs, logs
    with pytest.raises(helm.errors.HelmReleaseError):
        helm_test("not-served")
    helm_test("")  # the chart's default again: no test pod


def _client(stack: Stack) -> ClientLoop:
    return ClientLoop(stack.kubectl, stack.serving_ns, RUNTIME_CPU_IMAGE,
                      f"http://{NAME}.{stack.serving_ns}.svc:8000/v1")


def _assert_none_failed(tally: dict) -> None:
    print(f"client loop: {tally['ok']} answered, {tally['failed']} failed")
    assert tally["failed"] == 0, tally["errors"]
    assert tally["ok"] > 0


def test_spec_change_rolls_out_under_load_without_a_failed_request(stack: Stack) -> None:
    before = _rsvc(stack)["metadata"]["generation"]
    # An argument change (maxRunningRequests 16 -> 8); smaller requests also let the next test's
    # second replica fit on a laptop-sized node. The default rollout (no spec.rollout: surge
    # first) keeps one replica serving throughout.
    deployment = stack.kubectl.json("get", "deployment", NAME, "-n", stack.serving_ns)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    patch = {
        "spec": {
            "runtime": {"maxRunningRequests": 8},
            "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}},
        }
    }
    client = _client(stack)
    try:
        client.wait_ok(3)
        stack.kubectl(
            "patch", "rsvc", NAME, "-n", stack.serving_ns, "--type=merge", "-p", json.dumps(patch)
        )
        obj = _wait_ready_at_current_generation(stack, replicas=1)
        client.wait_ok(client.ok_seen() + 3)  # the new generation answers too
    finally:
        tally = client.stop()
    _assert_none_failed(tally)
    assert obj["metadata"]["generation"] == before + 1
    deployment = stack.kubectl.json("get", "deployment", NAME, "-n", stack.serving_ns)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-running-requests") + 1] == "8"
    # Ready means no pod of the old spec is still serving
    for pod_args in _pod_args(stack):
        assert pod_args[pod_args.index("--max-running-requests") + 1] == "8"


def test_kubectl_scale_up_and_down_under_load_without_a_failed_request(stack: Stack) -> None:
    client = _client(stack)
    try:
        client.wait_ok(3)
        stack.kubectl("scale", f"rsvc/{NAME}", "-n", stack.serving_ns, "--replicas=2")
        obj = _wait_ready_at_current_generation(stack, replicas=2)
        _check_two_replicas(stack, obj)
        client.wait_ok(client.ok_seen() + 3)
        stack.kubectl("scale", f"rsvc/{NAME}", "-n", stack.serving_ns, "--replicas=1")
        _wait_ready_at_current_generation(stack, replicas=1)
        wait_for("one pod left", lambda: len(_pod_args(stack)) == 1, timeout=300, interval=3)
        client.wait_ok(client.ok_seen() + 3)
    finally:
        tally = client.stop()
    _assert_none_failed(tally)


def test_operator_killed_mid_rollout_its_replacement_converges(stack: Stack) -> None:
    """The operator pod is killed right after a spec change: the Deployment it left (or did not
    yet write) is brought to the new spec by the replacement, and the status follows."""
    before = _rsvc(stack)["metadata"]["generation"]
    patch = {"spec": {"runtime": {"maxRunningRequests": 6}}}
    stack.kubectl("patch", "rsvc", NAME, "-n", stack.serving_ns, "--type=merge", "-p",
                  json.dumps(patch))
    stack.kubectl("delete", "pod", "-n", stack.operator_ns, "-l",
                  "app.kubernetes.io/component=operator", "--grace-period=0", "--force",
                  "--wait=false")
    obj = _wait_ready_at_current_generation(stack, replicas=1)
    assert obj["metadata"]["generation"] == before + 1
    for pod_args in _pod_args(stack):
        assert pod_args[pod_args.index("--max-running-requests") + 1] == "6"
    dep = stack.kubectl.json("get", "deployment", "radixserve-operator", "-n", stack.operator_ns)
    assert dep["status"].get("readyReplicas") == 1


def test_a_dead_server_process_is_restarted_and_serves_again(stack: Stack) -> None:
    """The kubelet restarts the container; the pod leaves the endpoints while it is not Ready."""
    pods = stack.kubectl.json("get", "pods", "-n", stack.serving_ns, "-l",
                              f"app.kubernetes.io/instance={NAME}")["items"]
    pod = next(p for p in pods if not p["metadata"].get("deletionTimestamp"))
    name, restarts = pod["metadata"]["name"], pod["status"]["containerStatuses"][0]["restartCount"]
    # the exec ends with the container it runs in: its exit status says nothing
    stack.kubectl("exec", name, "-n", stack.serving_ns, "--", "python", "-c", KILL_SERVER,
                  check=False)

    def restarted() -> bool:
        current = stack.kubectl.json("get", "pod", name, "-n", stack.serving_ns)
        return current["status"]["containerStatuses"][0]["restartCount"] > restarts

    wait_for(f"the kubelet to restart {name}'s server", restarted, timeout=300, interval=2)
    _wait_ready_at_current_generation(stack, replicas=1)
    answer = _chat_in_cluster(stack, f"http://{NAME}.{stack.serving_ns}.svc:8000/v1")
    assert "paris" in answer["choices"][0]["message"]["content"].lower(), answer


def _check_two_replicas(stack: Stack, obj: dict) -> None:
    assert obj["spec"]["replicas"] == 2 and obj["status"]["replicas"] == 2
    scale = json.loads(
        stack.kubectl(
            "get",
            "--raw",
            f"/apis/radixserve.dev/v1alpha1/namespaces/{stack.serving_ns}"
            f"/inferenceservices/{NAME}/scale",
        )
    )
    assert scale["status"]["replicas"] == 2 and scale["status"]["selector"]
    deployment = stack.kubectl.json("get", "deployment", NAME, "-n", stack.serving_ns)
    assert deployment["status"]["readyReplicas"] == 2


def test_delete_removes_its_children(stack: Stack) -> None:
    stack.kubectl("delete", "rsvc", NAME, "-n", stack.serving_ns, "--timeout=180s")

    def children() -> str:
        return stack.kubectl(
            "get",
            "deployments,services,pods",
            "-n",
            stack.serving_ns,
            "-l",
            f"app.kubernetes.io/instance={NAME}",
            "-o",
            "name",
        ).strip()

    started = time.monotonic()
    wait_for(
        f"children of {NAME} to be garbage-collected",
        lambda: children() == "",
        timeout=300,
        interval=3,
    )
    print(f"children gone after {time.monotonic() - started:.0f}s")
    assert stack.kubectl.get("rsvc", NAME, stack.serving_ns) is None


def test_gpu_request_schedules_on_the_advertised_capacity(stack: Stack) -> None:
    """A GPU replica (TP 1) requests nvidia.com/gpu; the node's fake capacity lets it schedule."""
    sample = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"]["name"] = name = "fake-gpu"
    sample["spec"]["gpu"] = {"enabled": True}
    sample["spec"]["resources"]["requests"] = {"cpu": "100m", "memory": "256Mi"}
    # the local provider's fake GPU nodes are tainted, so that CPU pods run on the real node
    sample["spec"]["tolerations"] = [{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                                      "effect": "NoSchedule"}]
    stack.kubectl("apply", "-n", stack.serving_ns, "-f", "-", input=yaml.safe_dump(sample))
    try:

        def scheduled_pod() -> dict | None:
            pods = stack.kubectl.json(
                "get", "pods", "-n", stack.serving_ns, "-l", f"app.kubernetes.io/instance={name}"
            )["items"]
            for pod in pods:
                conditions = pod["status"].get("conditions", [])
                if any(c["type"] == "PodScheduled" and c["status"] == "True" for c in conditions):
                    return pod
            return None

        pod = wait_for(f"a pod of {name} to be scheduled", scheduled_pod, timeout=300, interval=3)
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
        ready = _ready(stack.kubectl.get("rsvc", name, stack.serving_ns) or {}) or {}
        assert ready.get("reason") != "InsufficientGPU", ready
    finally:
        stack.kubectl("delete", "rsvc", name, "-n", stack.serving_ns, "--wait=false", check=False)


def test_operator_survives_the_run(stack: Stack) -> None:
    dep = stack.kubectl.json("get", "deployment", "radixserve-operator", "-n", stack.operator_ns)
    assert dep["status"].get("readyReplicas") == 1
    pods = stack.kubectl.json(
        "get", "pods", "-n", stack.operator_ns, "-l", "app.kubernetes.io/component=operator"
    )
    restarts = sum(
        cs["restartCount"] for p in pods["items"] for cs in p["status"].get("containerStatuses", [])
    )
    assert restarts == 0, "the operator restarted during the run"


def test_helm_uninstall_with_a_resource_present_leaves_nothing_terminating(stack: Stack) -> None:
    """No finalizer on the InferenceService: with the operator uninstalled, deleting the resource
    and its namespace still completes (the garbage collector removes the children)."""
    from tests.e2e.conftest import uninstall_chart

    sample = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"]["name"] = name = "left-behind"
    sample["spec"]["gpu"] = {"enabled": True}  # pending on the fake GPU nodes: no real container
    sample["spec"]["resources"]["requests"] = {"cpu": "100m", "memory": "256Mi"}
    stack.kubectl("apply", "-n", stack.serving_ns, "-f", "-", input=yaml.safe_dump(sample))
    wait_for(f"{name}'s Deployment", lambda: stack.kubectl.get("deployment", name, stack.serving_ns),
             timeout=120, interval=2)
    assert not (_rsvc_named(stack, name)["metadata"].get("finalizers") or [])
    uninstall_chart(stack)
    assert stack.kubectl.get("deployment", "radixserve-operator", stack.operator_ns) is None
    stack.kubectl("delete", "namespace", stack.serving_ns, "--wait=false")
    wait_for(f"namespace {stack.serving_ns} gone",
             lambda: not stack.kubectl("get", "namespace", stack.serving_ns, "--ignore-not-found",
                                       "-o", "name").strip(),
             timeout=180, interval=3)


def _rsvc_named(stack: Stack, name: str) -> dict:
    obj = stack.kubectl.get("rsvc", name, stack.serving_ns)
    assert obj is not None, f"InferenceService {name} is gone"
    return obj
