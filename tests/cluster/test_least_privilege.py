"""Least privilege on a real API server: the manifests' ValidatingAdmissionPolicy refuses an
InferenceService that asks for a hostPath volume (and the other things the operator refuses); a
namespace user who may only create InferenceServices gets no hostPath pod, and what the policy does
not read is refused by the operator before it creates anything; each InferenceService's pods get a
NetworkPolicy it owns."""

from __future__ import annotations

import pytest
import yaml

from tests.cluster.scenario import (
    Stack,
    account_kubeconfig,
    apply,
    children,
    condition,
    cpu_spec,
    delete_and_wait,
    get,
    live_pods,
    rsvc,
    try_apply,
    wait_ready,
    wait_reason,
)
from tests.e2e.kind_cluster import Kubectl, wait_for

pytestmark = pytest.mark.cluster
POLICY = "radixserve-inferenceservices"  # manifests/operator.yaml
HOST = {"name": "host", "hostPath": {"path": "/"}}
HOST_PATH = {"hostPath": {"path": "/"}}
APPARMOR = "container.apparmor.security.beta.kubernetes.io/server"


def _refused(stack: Stack, namespace: str, obj: dict) -> str:
    """What the API server said refusing `obj` by the manifests' policy; retried while that
    policy is not yet live, or while another's still answers first (the API server's admission
    cache lags a deleted policy, such as a Helm release's uninstalled by an earlier test)."""
    name = obj["metadata"]["name"]

    def attempt() -> str | None:
        accepted, out = try_apply(stack, namespace, obj)
        if accepted:
            stack.kubectl("delete", "rsvc", name, "-n", namespace, "--wait=false", check=False)
            return None
        return out if f"ValidatingAdmissionPolicy '{POLICY}'" in out else None

    return wait_for(f"the admission policy to refuse {name}", attempt, 30, 1)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        (cpu_spec(template={"spec": {"volumes": [HOST]}}), "volume host"),
        (cpu_spec(service={"type": "LoadBalancer"}), "spec.service.type"),
        (cpu_spec(runtime={"extraArgs": ["--api-key=s3cret"]}), "--api-key"),
        (cpu_spec(env=[{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]),
         "DB reads a Secret"),
        (cpu_spec(template={"spec": {"volumes": [{"name": "h", "emptyDir": None, **HOST_PATH}]}}),
         "volume h"),
        (cpu_spec(template={"spec": {"volumes": [{"name": "t", "emptyDir": {},
                                                   "configMap": {"name": "c"}}]}}),
         "volume t must have exactly one source"),
        (cpu_spec(service={"type": "LoadBalancer"}, apiKeySecretRef={"name": "k"},
                  env=[{"name": "RADIXSERVE_API_KEY",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['none']"}}}]),
         "RADIXSERVE_API_KEY is set by the operator"),
    ],
    ids=["hostPath", "open-load-balancer", "api-key-flag", "secret-outside-allow-list",
         "null-source-beside-hostPath", "two-sources", "api-key-env"],
)  # fmt: skip
def test_admission_policy_refuses(stack: Stack, namespace: str, spec: dict, fragment: str) -> None:
    out = _refused(stack, namespace, rsvc("refused", spec))
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in out and fragment in out, out
    assert get(stack, namespace, "rsvc", "refused") is None


def _create_as(user: Kubectl, namespace: str, obj: dict) -> tuple[bool, str]:
    try:
        out = user("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), timeout=60)
        return True, out
    except RuntimeError as e:
        return False, str(e)


def test_a_user_who_may_only_create_inferenceservices_gets_no_hostpath_pod(
    stack: Stack, namespace: str
) -> None:
    author = "isvc-author"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": author},
        "rules": [{"apiGroups": ["radixserve.dev"], "resources": ["inferenceservices"],
                   "verbs": ["create", "get"]}],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": author},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": author},
        "subjects": [{"kind": "ServiceAccount", "name": author, "namespace": namespace}],
    }  # fmt: skip
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": author}}
    apply(stack, namespace, account, role, binding)
    kubeconfig = account_kubeconfig(
        stack, author, namespace, stack.workdir / f"{namespace}.kubeconfig"
    )
    user = Kubectl(kubeconfig, stack.kubectl.binary)

    def can(verb: str, what: str) -> str:
        return user("auth", "can-i", verb, what, "-n", namespace, check=False).strip()

    assert can("create", "inferenceservices.radixserve.dev") == "yes"
    assert can("create", "pods") == can("create", "deployments") == "no"

    # asked for directly: refused at admission (once the policy is live)
    _refused(stack, namespace, rsvc("probe", cpu_spec(template={"spec": {"volumes": [HOST]}})))
    accepted, out = _create_as(
        user, namespace, rsvc("escalate", cpu_spec(template={"spec": {"volumes": [HOST]}}))
    )
    assert not accepted and "volume host" in out, out

    # what the policy does not read (an AppArmor annotation of the pods) the operator refuses,
    # with the field, before it creates anything
    sneaky = cpu_spec(template={"metadata": {"annotations": {APPARMOR: "unconfined"}}})
    accepted, out = _create_as(user, namespace, rsvc("sneaky", sneaky))
    assert accepted, out
    obj = wait_reason(stack, namespace, "sneaky", "PodSecurityViolation")
    assert APPARMOR in condition(obj)["message"]
    assert children(stack, namespace, "sneaky", "deployments,statefulsets,pods") == []

    # what the user may have runs, and no pod of the namespace mounts a path of the node
    accepted, out = _create_as(user, namespace, rsvc("fine", cpu_spec()))
    assert accepted, out
    wait_ready(stack, namespace, "fine", 1)
    pods = stack.kubectl.json("get", "pods", "-n", namespace)["items"]
    assert pods and not [v for p in pods for v in p["spec"].get("volumes") or () if "hostPath" in v]
    for name in ("sneaky", "fine"):
        delete_and_wait(stack, namespace, name)


def test_network_policy_is_owned_and_selects_the_servers_pods(stack: Stack, namespace: str) -> None:
    name = "fenced"
    apply(stack, namespace, rsvc(name, cpu_spec()))
    obj = wait_ready(stack, namespace, name, 1)
    policy = get(stack, namespace, "networkpolicy", name)
    assert policy is not None
    [owner] = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner.get("controller")) == (
        "InferenceService", name, obj["metadata"]["uid"], True,
    )  # fmt: skip
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    router = {"radixserve.dev/component": "router", "app.kubernetes.io/instance": name}
    assert {"podSelector": {"matchLabels": router}} in rule["from"]
    assert {"podSelector": {}} in rule["from"]  # the namespace's own pods, by default
    selector = policy["spec"]["podSelector"]["matchLabels"]
    [pod] = live_pods(stack, namespace, name)
    assert selector.items() <= pod["metadata"]["labels"].items()

    delete_and_wait(stack, namespace, name)
    wait_for(
        "the garbage collector to take the NetworkPolicy",
        lambda: get(stack, namespace, "networkpolicy", name) is None,
        60,
        1,
    )
