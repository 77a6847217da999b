"""Status from what exists, as a pure function: the Ready rule and the problem reasons."""

from __future__ import annotations

from typing import Any

from radixserve_operator.status import compute_status, get_condition


def resource(
    generation: int = 1, status: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "llm", "namespace": "ns", "generation": generation},
        "spec": spec,
        "status": status or {},
    }


def deployment(
    want: int,
    *,
    generation: int = 1,
    observed: int = 1,
    built_from: int = 1,
    tp: int = 2,
    conditions: list[dict[str, Any]] | None = None,
    **counts: int,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llm",
            "generation": generation,
            "annotations": {
                "radixserve.dev/generation": str(built_from),
                "radixserve.dev/tensor-parallel-size": str(tp),
                "radixserve.dev/gpus-per-replica": str(tp),
            },
        },
        "spec": {"replicas": want},
        "status": {"observedGeneration": observed, **counts, "conditions": conditions or []},
    }


def ready(status: dict[str, Any]) -> tuple[str, str]:
    c = get_condition(status, "Ready")
    return c["status"], c["reason"]


def test_complete_rollout_is_ready_with_counts_and_tp() -> None:
    st = compute_status(
        resource(), deployment(2, replicas=2, updatedReplicas=2, readyReplicas=2), []
    )
    assert ready(st) == ("True", "RolloutComplete")
    assert (
        st["tensorParallelSize"],
        st["gpusPerReplica"],
        st["replicas"],
        st["readyReplicas"],
    ) == (2, 2, 2, 2)
    assert st["observedGeneration"] == 1


def test_not_ready_while_an_old_pod_is_still_counted() -> None:
    # Surge: both new pods counted as updated, two pods ready (one of them old), three in total.
    st = compute_status(
        resource(), deployment(2, replicas=3, updatedReplicas=2, readyReplicas=2), []
    )
    assert ready(st) == ("False", "RollingOut")


def test_not_ready_before_the_deployment_controller_observed_the_change() -> None:
    dep = deployment(2, generation=5, observed=4, replicas=2, updatedReplicas=2, readyReplicas=2)
    assert ready(compute_status(resource(), dep, [])) == ("False", "RollingOut")


def test_not_ready_while_the_deployment_carries_an_older_generation() -> None:
    dep = deployment(2, built_from=1, replicas=2, updatedReplicas=2, readyReplicas=2)
    st = compute_status(resource(generation=2, status={"observedGeneration": 1}), dep, [])
    assert ready(st) == ("False", "Reconciling")
    assert st["observedGeneration"] == 1


def test_progress_deadline_exceeded_is_degraded() -> None:
    stuck = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "llm-1" has timed out progressing.',
        }
    ]
    st = compute_status(
        resource(), deployment(1, replicas=1, updatedReplicas=1, conditions=stuck), []
    )
    assert ready(st) == ("False", "ProgressDeadlineExceeded")
    assert get_condition(st, "Degraded")["status"] == "True"
    assert get_condition(st, "Progressing")["status"] == "False"


def test_replica_failure_is_degraded() -> None:
    quota = [
        {
            "type": "ReplicaFailure",
            "status": "True",
            "reason": "FailedCreate",
            "message": "exceeded quota",
        }
    ]
    st = compute_status(resource(), deployment(1, conditions=quota), [])
    assert ready(st) == ("False", "ReplicaFailure")
    assert get_condition(st, "Degraded")["message"] == "exceeded quota"


def test_scaled_to_zero_is_not_ready_and_not_progressing() -> None:
    st = compute_status(resource(), deployment(0), [])
    assert ready(st) == ("False", "ScaledToZero")
    assert get_condition(st, "Progressing")["status"] == "False"


def test_transition_time_moves_only_when_the_status_flips() -> None:
    dep = deployment(1, replicas=1, updatedReplicas=1, readyReplicas=0)
    first = compute_status(resource(), dep, [], now="2026-01-01T00:00:00Z")
    again = compute_status(resource(status=first), dep, [], now="2026-01-01T00:05:00Z")
    assert get_condition(again, "Ready")["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    dep["status"]["readyReplicas"] = 1
    flipped = compute_status(resource(status=again), dep, [], now="2026-01-01T00:09:00Z")
    assert get_condition(flipped, "Ready")["lastTransitionTime"] == "2026-01-01T00:09:00Z"
    assert get_condition(flipped, "Degraded")["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_endpoint_uses_the_service_port() -> None:
    st = compute_status(resource(service={"port": 80}), None, [])
    assert st["endpoint"] == "http://llm.ns.svc:80/v1"
    assert ready(st) == ("False", "Reconciling")


def _pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": status}


def test_bad_container_states_name_the_pod_and_the_last_exit() -> None:
    crashing = {
        "name": "server",
        "restartCount": 4,
        "state": {"waiting": {"reason": "RunContainerError", "message": "exec: no such file"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 127}},
    }
    pods = [_pod("llm-a", phase="Running", containerStatuses=[crashing])]
    dep = deployment(1, replicas=1, updatedReplicas=1, readyReplicas=0)
    st = compute_status(resource(), dep, pods)
    assert ready(st) == ("False", "RunContainerError")
    assert get_condition(st, "Ready")["message"] == (
        "llm-a: RunContainerError: exec: no such file (last exit: Error, code 127)"
    )
    assert get_condition(st, "Degraded")["status"] == "True"


def test_a_running_pod_that_never_turns_ready_is_named_in_the_rollout() -> None:
    unready = {
        "type": "Ready",
        "status": "False",
        "reason": "ContainersNotReady",
        "message": "containers with unready status: [server]",
    }
    pods = [_pod("llm-b", phase="Running", conditions=[unready])]
    dep = deployment(1, replicas=1, updatedReplicas=1, readyReplicas=0)
    st = compute_status(resource(), dep, pods)
    assert ready(st) == ("False", "RollingOut")
    assert get_condition(st, "Ready")["message"].endswith(
        "; llm-b: running but not ready (ContainersNotReady: containers with unready status: [server])"
    )
    assert get_condition(st, "Degraded")["status"] == "False"  # maybe still loading the model
