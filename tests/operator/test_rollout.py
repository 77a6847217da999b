"""The default rollout never takes down the last ready replica: the Deployment surges first
(maxSurge 1, maxUnavailable 0); where no node has room for the surge pod the rollout waits, the
previous replicas keep serving, and the status (reason SurgeBlocked) and a Warning event say so
and how to opt in to replacing pods in place."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.test_handlers import INSUFFICIENT, cond, pod, pod_event, state

from radixserve_operator import handlers
from radixserve_operator.builders import build_workload
from radixserve_operator.spec import parse_spec

PER_REPLICA = {"type": "pvcPerReplica", "size": "50Gi"}


@pytest.mark.parametrize(
    "rollout, cache, strategy",
    [
        ({}, None, {"maxSurge": 1, "maxUnavailable": 0}),
        ({"maxSurge": 0}, None, {"maxSurge": 0, "maxUnavailable": 1}),  # in place, opted in
        ({"maxUnavailable": 1}, None, {"maxSurge": 1, "maxUnavailable": 1}),
        ({"maxSurge": "50%", "maxUnavailable": 0}, None, {"maxSurge": "50%", "maxUnavailable": 0}),
        ({}, PER_REPLICA, {"maxUnavailable": 1}),  # a StatefulSet cannot surge
        ({"maxUnavailable": 2}, PER_REPLICA, {"maxUnavailable": 2}),
    ],
    ids=["default", "in-place", "unavailable-given", "both-given", "statefulset", "sts-given"],
)
def test_rollout_strategy(make_body, validate_k8s, rollout, cache, strategy) -> None:
    spec: dict[str, Any] = {"gpu": {"enabled": False}, "rollout": rollout}
    if cache:
        spec["model"] = {"cache": cache}
    workload = build_workload(parse_spec(make_body(spec)), 1, 1)
    validate_k8s(workload)
    if workload["kind"] == "StatefulSet":
        assert workload["spec"]["updateStrategy"]["rollingUpdate"] == strategy
    else:
        assert workload["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": strategy}


def test_the_crd_stores_no_counts_so_the_operator_chooses(make_body) -> None:
    from radixserve_operator.crd import spec_schema

    rollout = spec_schema()["properties"]["rollout"]
    assert rollout["default"] == {"strategy": "RollingUpdate"}
    assert all("default" not in rollout["properties"][k] for k in ("maxSurge", "maxUnavailable"))


def _rolling_with_blocked_surge(cluster, memo, make_body, spec: dict[str, Any]) -> None:
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    # one ready replica of the previous spec, and the new spec's surge pod nowhere to go
    cluster.set_rollout(observed=True, updated=1, ready=1, total=2)
    cluster.pods = [pod("llm-old"), pod("llm-new", phase="Pending",
                                        scheduled=("Unschedulable", INSUFFICIENT))]
    pod_event(cluster, memo, cluster.pods[1])


def test_a_surge_pod_with_no_room_is_reported_and_waited_for(cluster, memo, make_body) -> None:
    spec = {"model": {"source": "Qwen/Qwen3-0.6B"}, "parallelism": {"tensor": 1}}
    _rolling_with_blocked_surge(cluster, memo, make_body, spec)
    r = cluster.resource()
    assert state(r) == ("False", "False", "True", "SurgeBlocked")
    message = cond(r, "Ready")["message"]
    assert "1 ready replica(s) of the previous spec keep serving" in message
    assert INSUFFICIENT in message and "spec.rollout.maxSurge: 0 and maxUnavailable: 1" in message
    assert [e[:2] for e in cluster.events if e[0] == "Warning"][-1] == ("Warning", "SurgeBlocked")
    # the operator does not fall back by itself: the Deployment still surges
    assert cluster.deployment()["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1, "maxUnavailable": 0,
    }  # fmt: skip
    pod_event(cluster, memo, cluster.pods[1])  # the same news: no second event
    assert cluster.reasons().count("SurgeBlocked") == 1


def test_an_unschedulable_pod_without_a_surge_is_not_surge_blocked(cluster, memo, make_body) -> None:
    spec = {"model": {"source": "Qwen/Qwen3-0.6B"}, "parallelism": {"tensor": 1}, "replicas": 2}
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    cluster.set_rollout(observed=True, updated=2, ready=1, total=2)  # a scale-up, no rollout
    cluster.pods = [pod("llm-a"), pod("llm-b", phase="Pending",
                                      scheduled=("Unschedulable", INSUFFICIENT))]
    pod_event(cluster, memo, cluster.pods[1])
    assert state(cluster.resource())[3] == "InsufficientGPU"


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_the_spec_may_fall_back_to_in_place_for_that_rollout(cluster, memo, make_body) -> None:
    spec = {"model": {"source": "Qwen/Qwen3-0.6B"}, "parallelism": {"tensor": 1},
            "rollout": {"whenSurgeBlocked": "ReplaceInPlace"}}
    _rolling_with_blocked_surge(cluster, memo, make_body, spec)
    deployment = cluster.deployment()
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert deployment["metadata"]["annotations"]["radixserve.dev/replacing-in-place"] == "1"
    assert ("Normal", "ReplacingInPlace") in [e[:2] for e in cluster.events]
    # the old pod goes: the rollout proceeds in place, and says so
    cluster.pods[0]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cluster.set_rollout(observed=True, updated=1, ready=0, total=2)
    pod_event(cluster, memo, cluster.pods[0])
    r = cluster.resource()
    assert state(r) == ("False", "True", "False", "RollingOut")
    assert "replacing pods in place" in cond(r, "Ready")["message"]
    handlers.resync(body=r, memo=memo, logger=None)  # decided for this generation: it stays
    assert cluster.deployment()["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0

    # the next spec change surges first again
    cluster.edit_spec(lambda s: s.setdefault("runtime", {}).update(maxRunningRequests=8))
    handlers.on_update(body=cluster.resource(), memo=memo, logger=None, diff=[])
    deployment = cluster.deployment()
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert "radixserve.dev/replacing-in-place" not in deployment["metadata"]["annotations"]
