"""The operator under stress: killed mid-rollout, run as two peered replicas, and handed twenty
InferenceServices whose pods turn ready in bursts. Status must converge on the truth."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.cluster.operator_process import OperatorProcess
from tests.cluster.scenario import (
    REPO,
    Stack,
    account_kubeconfig,
    apply,
    children,
    condition,
    cpu_spec,
    delete_and_wait,
    get,
    ready_after,
    rsvc,
    wait_ready,
    wait_reason,
)
from tests.e2e.kind_cluster import wait_for

pytestmark = pytest.mark.cluster


def _paused(log: str) -> bool:
    """kopf's last word on peering in this log: paused (or never resumed)."""
    return log.rfind("Pausing operations in favour of") >= log.rfind("Resuming operations")


def _patch(stack: Stack, namespace: str, name: str, spec: dict) -> None:
    stack.kubectl("patch", "rsvc", name, "-n", namespace, "--type=merge",
                  "-p", json.dumps({"spec": spec}))  # fmt: skip


def test_operator_killed_mid_rollout_converges_without_duplicates(
    stack: Stack, namespace: str
) -> None:
    name = "restart"
    slow = cpu_spec(replicas=3, template={"metadata": {"annotations": ready_after(2500)}})
    apply(stack, namespace, rsvc(name, slow))
    wait_ready(stack, namespace, name, 3)
    _patch(stack, namespace, name, {"runtime": {"maxRunningRequests": 4}})
    wait_reason(stack, namespace, name, "RollingOut", timeout=30)
    stack.operator.stop(signal.SIGKILL)  # a crash, not a clean exit
    stack.operator.start()
    obj = wait_ready(stack, namespace, name, 3, timeout=180)
    assert obj["metadata"]["generation"] == 2
    assert len(children(stack, namespace, name, "deployments")) == 1
    assert len(children(stack, namespace, name, "services")) == 1
    delete_and_wait(stack, namespace, name)


def test_two_peered_operators_exactly_one_acts(stack: Stack, namespace: str) -> None:
    """Two replicas as the chart runs them: peering on, each with the chart's ServiceAccount."""
    import helm_python as helm

    release = peering = "rs-ha"
    values = {"fullnameOverride": release, "operator": {"replicas": 2, "peering": peering}}
    with helm.Config(kubeconfig_path=str(stack.kubeconfig), namespace=release) as cfg:
        cfg.install(str(REPO / "charts" / "radixserve"), release, values, namespace=release,
                    create_namespace=True, timeout=120)  # fmt: skip
    assert stack.kubectl.get("clusterkopfpeering", peering, "") is not None
    chart_account = account_kubeconfig(
        stack, f"{release}-operator", release, stack.workdir / "chart-operator.kubeconfig"
    )
    args = ("--all-namespaces", "--peering", peering)
    high = OperatorProcess(chart_account, stack.workdir / "op-high.log", args, priority=200)
    low = OperatorProcess(chart_account, stack.workdir / "op-low.log", args, priority=100)
    stack.operator.stop()
    try:
        high.start()
        low.start()
        # kopf starts every peer paused; the highest priority resumes, and a lower one that
        # resumed before it saw the higher peer pauses again in its favour
        wait_for("the high-priority operator to act",
                 lambda: "Resuming operations" in high.log(), 60)  # fmt: skip
        time.sleep(3)
        wait_for("the low-priority operator to stand by", lambda: _paused(low.log(5000)), 30)
        name = "peered"
        apply(stack, namespace, rsvc(name, cpu_spec()))
        wait_ready(stack, namespace, name, 1)
        created = "Handler 'on_create' succeeded"
        # NOTE: kopf logs the handler's success once its progress is stored, which a loaded
        # machine can finish after the Deployment is ready
        wait_for("the high-priority operator's create handler to finish",
                 lambda: created in high.log(5000), 60)  # fmt: skip
        assert created not in low.log(5000)

        high.stop()  # the standby takes over
        wait_for("the standby to resume", lambda: "Resuming operations" in low.log(), 90)
        _patch(stack, namespace, name, {"replicas": 2})
        obj = wait_ready(stack, namespace, name, 2)
        assert obj["metadata"]["generation"] == 2
        assert not high.alive()  # so the Deployment's new size came from the standby
        delete_and_wait(stack, namespace, name)
    finally:
        high.stop()
        low.stop()
        stack.operator.start()
        with helm.Config(kubeconfig_path=str(stack.kubeconfig), namespace=release) as cfg:
            cfg.uninstall(release, timeout=120)
        stack.kubectl("delete", "namespace", release, "--wait=false", check=False)


def test_twenty_at_once_every_status_matches_the_truth(stack: Stack, namespace: str) -> None:
    names = [f"burst-{i:02d}" for i in range(20)]
    objects = [
        rsvc(n, cpu_spec(template={"metadata": {"annotations": ready_after(300 + 250 * i)}}))
        for i, n in enumerate(names)
    ]
    apply(stack, namespace, *objects)

    def truth_and_status_agree(replicas: int) -> list[str] | None:
        wrong = []
        for n in names:
            obj = get(stack, namespace, "rsvc", n) or {}
            [dep] = children(stack, namespace, n, "deployments") or [{}]
            ready = (dep.get("status") or {}).get("readyReplicas") or 0
            st, cond = obj.get("status") or {}, condition(obj)
            gen = obj.get("metadata", {}).get("generation")
            if not (
                ready == replicas
                and st.get("readyReplicas") == replicas
                and cond.get("status") == "True"
                and cond.get("observedGeneration") == gen
            ):
                wrong.append(f"{n}: deployment ready {ready}, status {st.get('readyReplicas')} "
                             f"{cond.get('status')}/{cond.get('reason')}")  # fmt: skip
        return None if wrong else ["ok"]

    wait_for("20 statuses to match their Deployments", lambda: truth_and_status_agree(1), 60, 2)
    for n in names:  # a second burst: everyone scales at once
        stack.kubectl("scale", f"rsvc/{n}", "-n", namespace, "--replicas=2")
    wait_for("20 statuses to match after scaling", lambda: truth_and_status_agree(2), 60, 2)
    stack.kubectl("delete", "rsvc", "--all", "-n", namespace, "--wait=true", timeout=180)
