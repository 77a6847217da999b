"""What the cluster scenarios share: the stack, InferenceService specs, and the reads a user makes
(`kubectl get rsvc`, conditions, the children)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.operator_process import OperatorProcess
from tests.e2e.kind_cluster import Kubectl, wait_for

REPO = Path(__file__).resolve().parents[2]
INSTANCE = "app.kubernetes.io/instance"
# KWOK pod behaviours (scripts/cluster/kwok.py), chosen by pod annotations.
CRASHLOOP = {"radixserve.dev/test-crashloop": "true"}
NEVER_READY = {"radixserve.dev/test-never-ready": "true"}


def ready_after(ms: int) -> dict[str, str]:
    return {"radixserve.dev/test-ready-delay-ms": str(ms)}


@dataclass(frozen=True)
class Stack:
    kubectl: Kubectl
    kubeconfig: Path
    operator: OperatorProcess
    workdir: Path


def account_kubeconfig(stack: Stack, account: str, namespace: str, out: Path) -> Path:
    """A kubeconfig that acts as ServiceAccount `namespace/account` (so its RBAC is what is tested)."""
    from tests.cluster.operator_process import token_kubeconfig

    token = stack.kubectl("create", "token", account, "-n", namespace, "--duration=6h").strip()
    return token_kubeconfig(stack.kubeconfig, token, out)


def cpu_spec(**changes: Any) -> dict[str, Any]:
    """The CPU sample's spec (embedded model, no GPU) with small requests, plus `changes`."""
    sample = yaml.safe_load((REPO / "manifests/samples/inferenceservice-cpu.yaml").read_text())
    spec = sample["spec"]
    spec["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    spec.update(copy.deepcopy(changes))
    return spec


def gpu_spec(tp: int, replicas: int = 1, **changes: Any) -> dict[str, Any]:
    """A GPU replica of Qwen3-0.6B at an explicit TP (the hub is unreachable here: air-gapped)."""
    spec = {
        "model": {"source": "Qwen/Qwen3-0.6B"},
        "replicas": replicas,
        "parallelism": {"tensor": tp},
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
    }
    spec.update(copy.deepcopy(changes))
    return spec


def rsvc(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "radixserve.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def apply(stack: Stack, namespace: str, *objects: dict[str, Any], check: bool = True) -> str:
    text = "\n---\n".join(yaml.safe_dump(o) for o in objects)
    return stack.kubectl("apply", "-n", namespace, "-f", "-", input=text, check=check)


def try_apply(stack: Stack, namespace: str, obj: dict[str, Any]) -> tuple[bool, str]:
    """(accepted, what kubectl said) — for specs the API server should refuse."""
    from tests.e2e.kind_cluster import run

    try:
        out = run(
            [stack.kubectl.binary, f"--kubeconfig={stack.kubeconfig}", "apply", "-n", namespace,
             "-f", "-"],
            timeout=60,
            input=yaml.safe_dump(obj),
        )  # fmt: skip
        return True, out
    except RuntimeError as e:
        return False, str(e)


def get(stack: Stack, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    return stack.kubectl.get(kind, name, namespace)


def condition(obj: dict[str, Any] | None, type_: str = "Ready") -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or ():
        if c["type"] == type_:
            return c
    return {}


def children(stack: Stack, namespace: str, name: str, kinds: str) -> list[dict[str, Any]]:
    out = stack.kubectl.json("get", kinds, "-n", namespace, "-l", f"{INSTANCE}={name}")
    return out["items"]


def live_pods(stack: Stack, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        p for p in children(stack, namespace, name, "pods")
        if not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip


def wait_ready(stack: Stack, namespace: str, name: str, replicas: int, timeout: float = 120) -> dict:
    """Ready=True for the latest generation with `replicas` ready: what `kubectl wait` means."""

    def probe() -> dict | None:
        obj = get(stack, namespace, "rsvc", name) or {}
        st, ready = obj.get("status") or {}, condition(obj)
        gen = (obj.get("metadata") or {}).get("generation")
        done = (
            ready.get("status") == "True"
            and ready.get("observedGeneration") == gen
            and st.get("observedGeneration") == gen
            and st.get("readyReplicas") == replicas
            and st.get("replicas") == replicas
        )
        return obj if done else None

    return wait_for(f"{namespace}/{name} Ready with {replicas} replicas", probe, timeout, 0.5)


def wait_reason(
    stack: Stack, namespace: str, name: str, reason: str, timeout: float = 60
) -> dict[str, Any]:
    """Wait until the Ready condition's reason is `reason`; returns the resource."""

    def probe() -> dict | None:
        obj = get(stack, namespace, "rsvc", name)
        return obj if condition(obj).get("reason") == reason else None

    try:
        return wait_for(f"{namespace}/{name} reason {reason}", probe, timeout, 0.5)
    except TimeoutError as e:
        last = condition(get(stack, namespace, "rsvc", name))
        raise TimeoutError(f"{e}; Ready condition: {json.dumps(last)}") from None


def delete_and_wait(stack: Stack, namespace: str, name: str, timeout: float = 120) -> None:
    """Delete the InferenceService and wait until the garbage collector took its pods (and so
    freed their GPUs for the next scenario)."""
    stack.kubectl("delete", "rsvc", name, "-n", namespace, "--ignore-not-found", "--wait=true")
    wait_for(
        f"children of {namespace}/{name} gone",
        lambda: not children(stack, namespace, name, "deployments,replicasets,pods,services"),
        timeout,
        1,
    )
