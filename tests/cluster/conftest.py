"""The `cluster` tier: a real Kubernetes control plane (kube-apiserver, controller-manager,
scheduler, etcd, KWOK GPU nodes: `make cluster`), the CRD and RBAC installed from `manifests/` as
users do, and the operator as a real `radixserve-operator` process with the manifests'
ServiceAccount. The control plane is started here when it is not running (and stopped at the end,
unless RADIXSERVE_CLUSTER_KEEP=1); RADIXSERVE_CLUSTER_KUBECONFIG points the tier at another
cluster with KWOK nodes instead. Skipped, with the reason, where neither can be had (no Go)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.operator_process import OperatorProcess
from tests.cluster.scenario import REPO, Stack, account_kubeconfig
from tests.e2e.kind_cluster import Kubectl

OPERATOR_NS = "radixserve-system"
OPERATOR_SA = "radixserve-operator"


@contextlib.contextmanager
def _control_plane() -> Iterator[tuple[Path, str]]:
    """(kubeconfig, kubectl binary) of the cluster to test against."""
    existing = os.environ.get("RADIXSERVE_CLUSTER_KUBECONFIG")
    if existing:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            pytest.skip("RADIXSERVE_CLUSTER_KUBECONFIG is set but `kubectl` is not on PATH")
        yield Path(existing), kubectl
        return
    from scripts.cluster import controlplane

    reason = controlplane.unavailable_reason()
    if reason:
        pytest.skip(f"no local Kubernetes control plane here: {reason}")
    started = controlplane.current() is None
    # KWOK steers these scenarios' pods; the real node (the `node` tier's) stays out of them.
    cluster = controlplane.up(real_node=False)
    try:
        yield cluster.kubeconfig, str(cluster.kubectl)
    finally:
        if started and os.environ.get("RADIXSERVE_CLUSTER_KEEP") != "1":
            controlplane.down()


@pytest.fixture(scope="package")  # stopped before the real-pod suite brings its own cluster up
def stack() -> Iterator[Stack]:
    with _control_plane() as (kubeconfig, kubectl_bin):
        kubectl = Kubectl(kubeconfig, kubectl_bin)
        nodes = kubectl.json("get", "nodes")["items"]
        if not any(_is_kwok(n) for n in nodes):
            # the scenarios steer pods through KWOK's stages (ready delays, crash loops) and count
            # on its fake GPU capacity; on a cluster of real kubelets they would prove nothing
            pytest.skip("the cluster tier needs KWOK nodes (make cluster); this cluster has none")
        workdir = Path(tempfile.mkdtemp(prefix="radixserve-cluster-"))
        # Installed as the docs say: kubectl apply -f manifests/ (CRD, namespace, RBAC, operator).
        kubectl("apply", "-f", str(REPO / "manifests"))
        kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            "crd/inferenceservices.radixserve.dev",
        )  # fmt: skip
        operator = OperatorProcess(Path(), workdir / "operator.log")
        stack = Stack(kubectl, kubeconfig, operator, workdir)
        operator.kubeconfig = account_kubeconfig(
            stack, OPERATOR_SA, OPERATOR_NS, workdir / "operator.kubeconfig"
        )
        operator.start()
        try:
            yield stack
        finally:
            operator.stop()
            print(f"operator log: {operator.log_path}")


def _is_kwok(node: dict) -> bool:
    return (node["metadata"].get("annotations") or {}).get("kwok.x-k8s.io/node") == "fake"


@pytest.fixture(scope="module")
def namespace(stack: Stack, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the module's own (the operator watches every namespace)."""
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    name = f"t-{module}-{uuid.uuid4().hex[:5]}"  # never one left by an interrupted run
    stack.kubectl("create", "namespace", name)
    yield name
    stack.kubectl("delete", "namespace", name, "--wait=false", check=False)


def diagnostics(stack: Stack, namespace: str | None) -> str:
    k = stack.kubectl
    where = ["-n", namespace] if namespace else ["-A"]
    sections = {
        "inferenceservices": ["get", "rsvc", *where, "-o", "yaml"],
        "objects": ["get", "deployments,replicasets,pods,services", *where, "-o", "wide"],
        "events": ["get", "events", *where, "--sort-by=.lastTimestamp"],
    }
    out = [f"===== operator log (tail)\n{stack.operator.log(150)}"]
    for title, args in sections.items():
        try:
            text = k(*args, timeout=30, check=False)
        except Exception as e:  # noqa: BLE001 -- never hide the real failure
            text = f"<{type(e).__name__}: {e}>"
        out.append(f"===== {title}\n{text}")
    return "\n".join(out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    args = getattr(item, "funcargs", {})
    if report.when == "call" and report.failed and "stack" in args:
        report.sections.append(("cluster state", diagnostics(args["stack"], args.get("namespace"))))


def pytest_terminal_summary(terminalreporter) -> None:
    """The tier's own tally, so a CI log shows that it ran (and that nothing in it skipped)."""
    counts = {
        outcome: sum(
            1
            for r in terminalreporter.stats.get(outcome, [])
            if getattr(r, "nodeid", "").startswith("tests/cluster/") and r.when in ("call", "setup")
            and (outcome != "passed" or r.when == "call")
        )
        for outcome in ("passed", "failed", "error", "skipped")
    }
    if any(counts.values()):
        terminalreporter.write_line(
            "cluster tier (tests/cluster): " + ", ".join(f"{k} {v}" for k, v in counts.items())
        )
