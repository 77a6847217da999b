"""The stack of the real-pod suite: a cluster of real kubelets, the images on it, the chart
installed with real Helm, fake GPU capacity. Two providers: `kind` (Docker) and `local` (the real
node of `make cluster`, images built without Docker); RADIXSERVE_E2E_PROVIDER picks one, else kind
where Docker and kind are found, local otherwise. Everything is torn down at the end
(RADIXSERVE_E2E_KEEP=1 keeps the cluster to poke at); a failing test prints the cluster's state
and logs (also written to RADIXSERVE_E2E_LOGS)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.kind_cluster import KindCluster, Kubectl, build_image, missing_tools
from tests.e2e.local_cluster import local_stack

REPO = Path(__file__).resolve().parents[2]
CLUSTER = os.environ.get("RADIXSERVE_E2E_CLUSTER", "radixserve-e2e")
OPERATOR_NS = "radixserve-system"
SERVING_NS = "e2e-serving"  # not the operator's: proves it watches the whole cluster
RUNTIME_CPU_IMAGE = "ghcr.io/radixserve/radixserve:0.1.0-cpu"
OPERATOR_IMAGE = "ghcr.io/radixserve/radixserve-operator:0.1.0"
FAKE_GPUS = "4"


@dataclass(frozen=True)
class Stack:
    cluster: KindCluster | None  # None: the local provider
    kubectl: Kubectl
    operator_ns: str
    serving_ns: str
    kubeconfig: Path

    @property
    def local(self) -> bool:
        return self.cluster is None


def provider() -> str:
    chosen = os.environ.get("RADIXSERVE_E2E_PROVIDER", "")
    if chosen:
        if chosen not in ("kind", "local"):
            raise ValueError(f"RADIXSERVE_E2E_PROVIDER={chosen!r}: choose kind or local")
        return chosen
    return "kind" if missing_tools() is None else "local"


def _advertise_fake_gpus(kubectl: Kubectl) -> None:
    """A kind node has no GPU: advertised capacity lets pods requesting nvidia.com/gpu schedule."""
    patch = json.dumps(
        [
            {"op": "add", "path": f"/status/{field}/nvidia.com~1gpu", "value": FAKE_GPUS}
            for field in ("capacity", "allocatable")
        ]
    )
    for node in kubectl("get", "nodes", "-o", "name").split():
        kubectl("patch", node, "--subresource=status", "--type=json", "-p", patch)


# The chart's values in this suite: images are on the nodes already, the operator logs in detail.
OPERATOR_VALUES = {"operator": {"image": {"pullPolicy": "Never"}, "verbose": True}}


def _install_chart(stack: Stack) -> None:
    from scripts.cluster.deploy import install_chart

    install_chart(stack.kubeconfig, OPERATOR_VALUES)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    if provider() == "local":
        yield from _local_stack()
        return
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    workdir = Path(tempfile.mkdtemp(prefix="radixserve-e2e-"))
    cluster = KindCluster(CLUSTER, workdir / "kubeconfig")
    stack = Stack(cluster, cluster.kubectl, OPERATOR_NS, SERVING_NS, cluster.kubeconfig)
    try:
        build_image(REPO, "runtime-cpu", RUNTIME_CPU_IMAGE)
        build_image(REPO, "operator", OPERATOR_IMAGE)
        cluster.create()
        for image in (RUNTIME_CPU_IMAGE, OPERATOR_IMAGE):
            cluster.load_image(image, workdir)
        _advertise_fake_gpus(stack.kubectl)
        _install_chart(stack)
        stack.kubectl("create", "namespace", stack.serving_ns)
        yield stack
    except BaseException:
        print(diagnostics(stack))
        raise
    finally:
        if os.environ.get("RADIXSERVE_E2E_KEEP") == "1":
            print(f"keeping kind cluster {CLUSTER}: KUBECONFIG={cluster.kubeconfig}")
        else:
            cluster.delete()


def _local_stack() -> Iterator[Stack]:
    with local_stack() as (kubeconfig, kubectl_bin):
        kubectl = Kubectl(kubeconfig, kubectl_bin)
        stack = Stack(None, kubectl, OPERATOR_NS, SERVING_NS, kubeconfig)
        try:
            _remove_earlier_run(stack)  # a kept cluster (RADIXSERVE_E2E_KEEP=1) is reused
            _install_chart(stack)
            kubectl("create", "namespace", stack.serving_ns)
            yield stack
        except BaseException:
            print(diagnostics(stack))
            raise
        finally:
            kubectl("delete", "namespace", stack.serving_ns, "--timeout=180s", check=False,
                    timeout=240)
            uninstall_chart(stack)


def _remove_earlier_run(stack: Stack) -> None:
    # the serving namespace goes first, while an operator is still there to let its objects go
    stack.kubectl("delete", "namespace", stack.serving_ns, "--ignore-not-found", "--timeout=180s",
                  timeout=240)
    uninstall_chart(stack)


def uninstall_chart(stack: Stack) -> None:
    """`helm uninstall` of the chart, waiting until its objects are gone; absent is fine."""
    import helm_python as helm

    with helm.Config(kubeconfig_path=str(stack.kubeconfig), namespace=stack.operator_ns) as cfg:
        cfg.uninstall("radixserve", ignore_not_found=True, wait="watcher", timeout=180)


def diagnostics(stack: Stack) -> str:
    k = stack.kubectl
    sections = {
        "objects": ["get", "nodes,all,rsvc", "-A", "-o", "wide"],
        "inferenceservices": ["get", "rsvc", "-A", "-o", "yaml"],
        "events": ["get", "events", "-A", "--sort-by=.lastTimestamp"],
        "operator logs": [
            "logs",
            "-n",
            stack.operator_ns,
            "deploy/radixserve-operator",
            "--tail=300",
        ],
        "server logs": [
            "logs",
            "-n",
            stack.serving_ns,
            "-l",
            "app.kubernetes.io/component=inference",
            "--all-containers",
            "--prefix",
            "--tail=200",
        ],
        "pods": ["describe", "pods", "-n", stack.serving_ns],
    }
    out = []
    for title, args in sections.items():
        try:
            text = k(*args, timeout=60, check=False)
        except (
            OSError,
            RuntimeError,
            subprocess.TimeoutExpired,
        ) as e:  # never hide the real failure
            text = f"<{type(e).__name__}: {e}>"
        out.append(f"===== {title}: kubectl {' '.join(args)}\n{text}")
    return "\n".join(out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "stack" in getattr(item, "funcargs", {}):
        text = diagnostics(item.funcargs["stack"])
        report.sections.append(("cluster state", text))
        logs_dir = os.environ.get("RADIXSERVE_E2E_LOGS")
        if logs_dir:
            Path(logs_dir).mkdir(parents=True, exist_ok=True)
            (Path(logs_dir) / f"{item.name}.log").write_text(text)
