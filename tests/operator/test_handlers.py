"""The kopf handlers, called directly (as kopf would, with keyword arguments) against a fake
cluster: create -> progressing -> ready -> spec change -> progressing -> ready; invalid TP;
GPUs that cannot be scheduled; an unreachable hub; a deleted Deployment."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from radixserve_operator import handlers

QWEN = {
    "model": {"source": "Qwen/Qwen3-0.6B"},
    "parallelism": {"tensor": "auto"},
    "gpu": {"memoryGiB": 80},
    "replicas": 2,
}
INSUFFICIENT = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
    "3 No preemption victims found for incoming pod."
)


def cond(resource: dict[str, Any], type_: str) -> dict[str, Any]:
    (c,) = [c for c in resource["status"]["conditions"] if c["type"] == type_]
    return c


def state(resource: dict[str, Any]) -> tuple[str, str, str, str]:
    """(Ready, Progressing, Degraded, Ready's reason)."""
    return (
        cond(resource, "Ready")["status"],
        cond(resource, "Progressing")["status"],
        cond(resource, "Degraded")["status"],
        cond(resource, "Ready")["reason"],
    )


def args(cluster) -> list[str]:
    return cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"]


def pod(
    name: str,
    *,
    phase: str = "Running",
    scheduled: tuple[str, str] | None = None,
    waiting: str | None = None,
    terminating: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "serving",
        "labels": {
            "app.kubernetes.io/name": "radixserve",
            "app.kubernetes.io/instance": "llm",
            "app.kubernetes.io/managed-by": "radixserve-operator",
        },
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if scheduled:
        status["conditions"].append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": scheduled[0],
                "message": scheduled[1],
            }
        )
    if waiting:
        status["containerStatuses"] = [
            {"name": "server", "state": {"waiting": {"reason": waiting, "message": "boom"}}}
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def deployment_event(cluster, memo, type_: str = "MODIFIED") -> None:
    handlers.on_deployment_event(body=cluster.deployment(), memo=memo, type=type_, logger=None)


def pod_event(cluster, memo, body: dict[str, Any]) -> None:
    handlers.on_pod_event(body=body, memo=memo, type="MODIFIED", logger=None)


def test_create_rollout_update_rollout(cluster, memo, make_body) -> None:
    handlers.on_create(body=cluster.create(make_body(QWEN)), memo=memo, logger=None)
    assert set(cluster.objects) == {
        ("InferenceService", "serving", "llm"),
        ("Deployment", "serving", "llm"),
        ("Service", "serving", "llm"),
        ("NetworkPolicy", "serving", "llm"),
        ("PodDisruptionBudget", "serving", "llm"),  # two replicas
    }
    assert cluster.deployment()["metadata"]["ownerReferences"][0]["uid"] == "uid-llm"
    assert cluster.events[0][:2] == ("Normal", "Created") and "TP 1" in cluster.events[0][2]
    r = cluster.resource()
    assert state(r) == ("False", "True", "False", "RollingOut")
    assert r["status"]["tensorParallelSize"] == 1 and r["status"]["gpusPerReplica"] == 1
    assert r["status"]["endpoint"] == "http://llm.serving.svc:8000/v1"
    assert (
        r["status"]["selector"]
        == "app.kubernetes.io/instance=llm,app.kubernetes.io/name=radixserve"
    )
    assert r["status"]["observedGeneration"] == 1

    cluster.set_rollout(observed=True, updated=2, ready=1, total=2)
    deployment_event(cluster, memo)
    r = cluster.resource()
    assert state(r) == ("False", "True", "False", "RollingOut")
    assert "1/2 ready" in cond(r, "Progressing")["message"]

    cluster.set_rollout(observed=True, updated=2, ready=2, total=2)
    deployment_event(cluster, memo)
    r = cluster.resource()
    assert state(r) == ("True", "False", "False", "RolloutComplete")
    assert (
        r["status"]["readyReplicas"],
        r["status"]["updatedReplicas"],
        r["status"]["replicas"],
    ) == (2, 2, 2)
    ready_since = cond(r, "Ready")["lastTransitionTime"]
    patches = len(cluster.status_patches)
    deployment_event(cluster, memo)  # nothing changed: no patch, no second event
    assert len(cluster.status_patches) == patches
    assert cluster.reasons() == ["Created", "RolloutComplete"]

    # The user edits the spec; until the operator has applied it, the old pods serve the old
    # spec, so the resource is not Ready even though every pod is.
    cluster.edit_spec(lambda s: s.setdefault("runtime", {}).update(maxRunningRequests=64))
    pod_event(cluster, memo, pod("llm-old-1"))
    assert state(cluster.resource()) == ("False", "True", "False", "Reconciling")

    handlers.on_update(
        body=cluster.resource(),
        memo=memo,
        logger=None,
        diff=[("add", ("runtime", "maxRunningRequests"), None, 64)],
    )
    a = args(cluster)
    assert a[a.index("--max-running-requests") + 1] == "64"
    assert cluster.events[-1][:2] == ("Normal", "Updated")
    assert "spec.runtime.maxRunningRequests" in cluster.events[-1][2]
    r = cluster.resource()
    assert state(r) == (
        "False",
        "True",
        "False",
        "RollingOut",
    )  # Deployment has not observed it yet
    assert r["status"]["observedGeneration"] == 2 and cond(r, "Ready")["observedGeneration"] == 2
    assert cond(r, "Ready")["lastTransitionTime"] >= ready_since

    cluster.set_rollout(
        observed=True, updated=1, ready=2, total=2
    )  # one new pod, one old, both ready
    deployment_event(cluster, memo)
    assert state(cluster.resource()) == ("False", "True", "False", "RollingOut")

    cluster.set_rollout(observed=True, updated=2, ready=2, total=2)
    deployment_event(cluster, memo)
    assert state(cluster.resource()) == ("True", "False", "False", "RolloutComplete")
    assert cluster.reasons() == ["Created", "RolloutComplete", "Updated", "RolloutComplete"]


def _ready(cluster, memo, make_body, spec: dict[str, Any]) -> None:
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    n = spec.get("replicas", 1)
    cluster.set_rollout(observed=True, updated=n, ready=n, total=n)
    deployment_event(cluster, memo)
    assert state(cluster.resource())[0] == "True"


def test_invalid_tp_is_reported_once_and_not_retried(cluster, memo, make_body) -> None:
    _ready(cluster, memo, make_body, QWEN)
    applied = len(cluster.applied)

    twelve_heads = {"parameterCount": "1B", "numAttentionHeads": 12, "numHiddenLayers": 4, "headDim": 64}

    def tp8_on_12_heads(s: dict[str, Any]) -> None:
        s["parallelism"]["tensor"] = 8
        s["model"]["parameters"] = twelve_heads

    cluster.edit_spec(tp8_on_12_heads)
    with pytest.raises(kopf.PermanentError, match="TP 8 does not divide"):  # kopf: no retry
        handlers.on_update(body=cluster.resource(), memo=memo, logger=None, diff=[])
    r = cluster.resource()
    assert state(r) == ("False", "False", "True", "InvalidSpec")
    assert "TP 8 does not divide the model's 12 attention heads" in cond(r, "Ready")["message"]
    assert cond(r, "Degraded")["reason"] == "InvalidSpec"
    assert r["status"]["observedGeneration"] == 2
    assert cluster.events[-1][:2] == ("Warning", "InvalidSpec")
    assert (
        len(cluster.applied) == applied
        and "--tp" in args(cluster)
        and args(cluster)[args(cluster).index("--tp") + 1] == "1"
    )

    # An operator restart, and the old pods' events, neither repeat the warning nor hide it.
    with pytest.raises(kopf.PermanentError):
        handlers.on_resume(body=cluster.resource(), memo=memo, logger=None)
    deployment_event(cluster, memo)
    pod_event(cluster, memo, pod("llm-1"))
    assert cluster.reasons().count("InvalidSpec") == 1
    assert state(cluster.resource())[3] == "InvalidSpec"

    cluster.edit_spec(lambda s: s["parallelism"].update(tensor=2))
    handlers.on_update(body=cluster.resource(), memo=memo, logger=None, diff=[])
    assert args(cluster)[args(cluster).index("--tp") + 1] == "2"
    assert state(cluster.resource()) == ("False", "True", "False", "RollingOut")


def test_invalid_spec_on_create_builds_nothing(cluster, memo, make_body) -> None:
    with pytest.raises(kopf.PermanentError):
        handlers.on_create(
            body=cluster.create(make_body({"parallelism": {"tensor": 2}})), memo=memo, logger=None
        )
    assert ("Deployment", "serving", "llm") not in cluster.objects
    assert state(cluster.resource())[3] == "InvalidSpec"
    assert cluster.reasons() == ["InvalidSpec"]


def test_unschedulable_gpu_pod_is_insufficient_gpu(cluster, memo, make_body) -> None:
    handlers.on_create(
        body=cluster.create(make_body({**QWEN, "replicas": 1})), memo=memo, logger=None
    )
    cluster.set_rollout(observed=True, updated=1, ready=0, total=1)
    cluster.pods = [pod("llm-a", phase="Pending", scheduled=("Unschedulable", INSUFFICIENT))]
    pod_event(cluster, memo, cluster.pods[0])
    r = cluster.resource()
    assert state(r) == ("False", "False", "True", "InsufficientGPU")
    assert cond(r, "Progressing")["reason"] == "InsufficientGPU"
    assert cond(r, "Degraded")["message"] == INSUFFICIENT
    assert cluster.events[-1] == ("Warning", "InsufficientGPU", INSUFFICIENT)

    pod_event(cluster, memo, cluster.pods[0])  # the same news again: no second warning
    assert cluster.reasons().count("InsufficientGPU") == 1

    cluster.pods = [pod("llm-a")]  # a GPU freed up
    cluster.set_rollout(observed=True, updated=1, ready=1, total=1)
    pod_event(cluster, memo, cluster.pods[0])
    assert state(cluster.resource()) == ("True", "False", "False", "RolloutComplete")


def test_no_node_advertises_the_gpu(cluster, memo, make_body) -> None:
    handlers.on_create(body=cluster.create(make_body({"replicas": 1})), memo=memo, logger=None)
    cluster.gpu_nodes = 0
    cluster.pods = [pod("llm-a", phase="Pending")]  # no scheduler verdict yet: nodes not listed
    pod_event(cluster, memo, cluster.pods[0])
    assert cluster.node_lists == 0 and state(cluster.resource())[3] == "RollingOut"
    verdict = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    cluster.pods = [pod("llm-a", phase="Pending", scheduled=("Unschedulable", verdict))]
    pod_event(cluster, memo, cluster.pods[0])
    r = cluster.resource()
    assert state(r)[3] == "InsufficientGPU"
    assert cond(r, "Degraded")["message"] == f"no node advertises nvidia.com/gpu; scheduler: {verdict}"


def test_other_unschedulable_reasons_are_not_blamed_on_gpus(cluster, memo, make_body) -> None:
    handlers.on_create(body=cluster.create(make_body({"replicas": 1})), memo=memo, logger=None)
    msg = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    cluster.pods = [pod("llm-a", phase="Pending", scheduled=("Unschedulable", msg))]
    pod_event(cluster, memo, cluster.pods[0])
    assert state(cluster.resource()) == ("False", "False", "True", "Unschedulable")


def test_pod_waiting_for_gpus_of_a_terminating_pod_is_still_rolling(
    cluster, memo, make_body
) -> None:
    handlers.on_create(body=cluster.create(make_body({"replicas": 1})), memo=memo, logger=None)
    cluster.set_rollout(observed=True, updated=1, ready=0, total=1)
    cluster.pods = [
        pod("llm-old", terminating=True),
        pod("llm-new", phase="Pending", scheduled=("Unschedulable", INSUFFICIENT)),
    ]
    pod_event(cluster, memo, cluster.pods[1])
    r = cluster.resource()
    assert state(r) == ("False", "True", "False", "RollingOut")
    assert "terminating pods" in cond(r, "Progressing")["message"]


def test_crash_looping_pod_is_degraded(cluster, memo, make_body) -> None:
    handlers.on_create(body=cluster.create(make_body({"replicas": 1})), memo=memo, logger=None)
    cluster.set_rollout(observed=True, updated=1, ready=0, total=1)
    cluster.pods = [pod("llm-a", waiting="CrashLoopBackOff")]
    pod_event(cluster, memo, cluster.pods[0])
    assert state(cluster.resource()) == ("False", "True", "True", "CrashLoopBackOff")
    assert cluster.events[-1][:2] == ("Warning", "CrashLoopBackOff")


def test_unreachable_hub_retries_later(cluster, make_body) -> None:
    from radixserve_operator.modelconfig import ModelConfigUnavailable

    def offline(repo: str, revision: str | None = None) -> dict:
        raise ModelConfigUnavailable(f"cannot reach the Hugging Face hub for {repo!r}")

    memo = kopf.Memo(client=cluster, fetch_config=offline)
    with pytest.raises(kopf.TemporaryError) as err:
        handlers.on_create(body=cluster.create(make_body(QWEN)), memo=memo, logger=None)
    assert err.value.delay == handlers.RETRY_DELAY_S
    [(kind, reason, message)] = cluster.events
    assert (kind, reason) == ("Warning", "ModelConfigUnavailable")
    assert message.startswith("cannot reach the Hugging Face hub for 'Qwen/Qwen3-0.6B'")
    assert "spec.parallelism.tensor" in message  # says how to deploy without the hub
    assert ("Deployment", "serving", "llm") not in cluster.objects
    r = cluster.resource()  # and the resource says so too, not just an event
    assert state(r) == ("False", "False", "True", "ModelConfigUnavailable")
    assert cond(r, "Ready")["message"] == message

    # A retry while the hub stays unreachable repeats no event; pod events keep the verdict.
    with pytest.raises(kopf.TemporaryError):
        handlers.resync(body=cluster.resource(), memo=memo, logger=None)
    assert len(cluster.events) == 1 and state(cluster.resource())[3] == "ModelConfigUnavailable"


def test_explicit_tp_deploys_without_the_hub(cluster, make_body) -> None:
    """An air-gapped or gated model: with `tensor` given, the unreachable hub is no obstacle."""
    from radixserve_operator.modelconfig import ModelConfigUnavailable

    def offline(repo: str, revision: str | None = None) -> dict:
        raise ModelConfigUnavailable(f"cannot reach the Hugging Face hub for {repo!r}")

    memo = kopf.Memo(client=cluster, fetch_config=offline)
    spec = {**QWEN, "parallelism": {"tensor": 2}}
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert args(cluster)[args(cluster).index("--tp") + 1] == "2"
    assert state(cluster.resource()) == ("False", "True", "False", "RollingOut")
    assert ("Warning", "TPUnchecked") in [e[:2] for e in cluster.events]


def test_unknown_hub_model_is_invalid(cluster, memo, make_body) -> None:
    spec = {**QWEN, "model": {"source": "org/does-not-exist"}}
    with pytest.raises(kopf.PermanentError):
        handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert state(cluster.resource())[3] == "InvalidSpec"


def test_deleted_deployment_is_recreated(cluster, memo, make_body) -> None:
    _ready(cluster, memo, make_body, {"replicas": 1})
    gone = cluster.objects.pop(("Deployment", "serving", "llm"))
    handlers.on_deployment_event(body=gone, memo=memo, type="DELETED", logger=None)
    assert ("Deployment", "serving", "llm") in cluster.objects
    assert state(cluster.resource())[0] == "False"


def test_scale_changes_replicas_without_new_pods(cluster, memo, make_body) -> None:
    _ready(cluster, memo, make_body, {"replicas": 1})
    template = cluster.deployment()["spec"]["template"]
    cluster.edit_spec(
        lambda s: s.update(replicas=3)
    )  # what `kubectl scale rsvc/llm --replicas 3` does
    handlers.on_update(
        body=cluster.resource(), memo=memo, logger=None, diff=[("change", ("replicas",), 1, 3)]
    )
    assert cluster.deployment()["spec"]["replicas"] == 3
    assert cluster.deployment()["spec"]["template"] == template


def test_events_after_the_resource_is_gone_are_ignored(cluster, memo, make_body) -> None:
    _ready(cluster, memo, make_body, {"replicas": 1})
    del cluster.objects[("InferenceService", "serving", "llm")]
    patches = len(cluster.status_patches)
    pod_event(cluster, memo, pod("llm-a"))
    deployment_event(cluster, memo)
    assert len(cluster.status_patches) == patches


def test_handlers_are_registered_with_kopf() -> None:
    registry = kopf.get_default_registry()
    fns = {h.fn for h in registry._changing.get_all_handlers()} | {
        h.fn for h in registry._watching.get_all_handlers()
    }
    assert {
        handlers.on_create,
        handlers.on_update,
        handlers.on_resume,
        handlers.on_deployment_event,
        handlers.on_pod_event,
    } <= fns
    # GC, not finalizers: no deletion handler, and no kopf timer or daemon (kopf puts its
    # finalizer on every resource that has one)
    assert not any(h.requires_finalizer for h in registry._changing.get_all_handlers())
    assert not registry._spawning.get_all_handlers()


def test_resync_reconciles_each_handled_resource_and_forgets_deleted_ones(
        cluster, memo, make_body) -> None:
    """The loop repairs a hand edit of a handled resource's child; a resource it never handled
    (another operator's, or a standby peer's) is not touched; a deleted one leaves the loop."""
    import copy

    from radixserve_operator.resync import Resync

    memo["seen"] = set()  # as `configure` leaves it: one set shared by the handlers' memo copies
    for name in ("a", "b"):
        body = make_body(QWEN)
        body["metadata"]["name"] = name
        handlers.on_create(body=cluster.create(body), memo=copy.copy(memo), logger=None)
    other = make_body(QWEN)
    other["metadata"]["name"] = "never-handled"
    cluster.create(other)
    assert memo["seen"] == {("serving", "a"), ("serving", "b")}
    desired = cluster.objects[("Deployment", "serving", "a")]["spec"]["replicas"]
    cluster.objects[("Deployment", "serving", "a")]["spec"]["replicas"] = desired + 5  # a hand edit
    cluster.objects[("InferenceService", "serving", "b")]["metadata"]["deletionTimestamp"] = "now"
    reconciled: list[str] = []

    def reconcile_one(body: dict) -> None:
        reconciled.append(body["metadata"]["name"])
        handlers.resync(body=body, memo=memo, logger=None)

    Resync(cluster, memo["seen"], reconcile_one, interval=60).run_once()
    assert reconciled == ["a"]
    assert cluster.objects[("Deployment", "serving", "a")]["spec"]["replicas"] == desired
    assert ("Deployment", "serving", "never-handled") not in cluster.objects
    assert memo["seen"] == {("serving", "a")}


def test_a_failing_resync_of_one_resource_does_not_stop_the_others(cluster, memo) -> None:
    from radixserve_operator.resync import Resync

    bodies = {("serving", n): {"metadata": {"namespace": "serving", "name": n}} for n in "xyz"}
    cluster.get = lambda api_version, kind, ns, name: bodies[(ns, name)]
    done: list[str] = []

    def reconcile_one(body: dict) -> None:
        if body["metadata"]["name"] == "x":
            raise RuntimeError("boom")
        done.append(body["metadata"]["name"])

    Resync(cluster, set(bodies), reconcile_one, interval=60).run_once()
    assert done == ["y", "z"]
