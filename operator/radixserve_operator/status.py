"""Status from what exists: the custom resource, its workload (Deployment, or StatefulSet for a PVC
per replica: their status fields are the same) and the workload's pods -> the resource's `status` (conditions Ready / Progressing / Degraded, counts, TP, endpoint, selector).
Pure: the caller reads the objects and writes the result."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, NamedTuple

from radixserve_operator import (
    ANNOTATION_GENERATION,
    ANNOTATION_GPUS,
    ANNOTATION_IN_PLACE,
    ANNOTATION_TP,
)
from radixserve_operator.builders import selector_string

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
# Written by the reconciler; carried over here as they are.
AUTOSCALING = "Autoscaling"
CACHE_SHARED_RWO = "CacheSharedReadWriteOnce"
INVALID_SPEC = "InvalidSpec"
MODEL_CONFIG_UNAVAILABLE = "ModelConfigUnavailable"
POD_SECURITY_VIOLATION = "PodSecurityViolation"  # podsecurity.PodSecurityError
REFERENCE_NOT_ALLOWED = "ReferenceNotAllowed"  # references.ReferenceNotAllowed
IMAGE_NOT_ALLOWED = "ImageNotAllowed"  # images.ImageNotAllowed
NAME_CONFLICT = "NameConflict"  # ownership: another object holds a name this one derives
# Verdicts the reconciler writes (not computed from the children): they stand for their
# generation until a Deployment carrying that generation exists.
RECONCILER_REASONS = (
    INVALID_SPEC,
    MODEL_CONFIG_UNAVAILABLE,
    POD_SECURITY_VIOLATION,
    REFERENCE_NOT_ALLOWED,
    IMAGE_NOT_ALLOWED,
    NAME_CONFLICT,
)
SURGE_BLOCKED = "SurgeBlocked"
INSUFFICIENT_GPU = "InsufficientGPU"
# Container states (waiting reasons) that no amount of waiting fixes without a change.
BAD_CONTAINER_STATES = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "PreCreateHookError",
    "PostStartHookError",
)


class Verdict(NamedTuple):
    ready: bool
    progressing: bool
    degraded: bool
    reason: str
    message: str


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def get_condition(status: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in (status or {}).get("conditions") or ():
        if c.get("type") == type_:
            return c
    return None


def _conditions(
    prev: dict[str, Any] | None, v: Verdict, generation: int, now: str
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    healthy_reason = "AsExpected" if not v.degraded else v.reason
    for type_, flag, reason in (
        (READY, v.ready, v.reason),
        (PROGRESSING, v.progressing, v.reason),
        (DEGRADED, v.degraded, healthy_reason),
    ):
        status = "True" if flag else "False"
        old = get_condition(prev, type_)
        changed = old is None or old.get("status") != status
        out.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": v.message if (flag or type_ != DEGRADED) else "",
                "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
                "observedGeneration": generation,
            }
        )
    # Conditions the reconciler owns (Autoscaling, CacheSharedReadWriteOnce) are not this
    # function's to decide.
    ours = {READY, PROGRESSING, DEGRADED}
    return out + [c for c in (prev or {}).get("conditions") or () if c.get("type") not in ours]


class PodProblems(NamedTuple):
    unschedulable: list[str]  # the scheduler's messages
    broken: list[str]  # "POD: REASON: message" of containers in a bad state
    not_ready: list[str]  # "POD: message" of running pods that are not ready, or initialising
    terminating: bool


def _last_exit(cs: dict[str, Any]) -> str:
    term = (cs.get("lastState") or {}).get("terminated") or {}
    if not term:
        return ""
    return f" (last exit: {term.get('reason') or 'terminated'}, code {term.get('exitCode', '?')})"


def pod_problems(pods: list[dict[str, Any]]) -> PodProblems:
    """What keeps the pods from serving, as the user would read it in `kubectl describe pod`."""
    out = PodProblems([], [], [], False)
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            out = out._replace(terminating=True)
            continue
        name = pod["metadata"].get("name", "?")
        st = pod.get("status") or {}
        for c in st.get("conditions") or ():
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"
            ):
                out.unschedulable.append(c.get("message") or "unschedulable")
            if c.get("type") == "Ready" and c.get("status") == "False" and st.get("phase") == "Running":
                why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
                out.not_ready.append(f"{name}: running but not ready" + (f" ({why})" if why else ""))
        for cs in st.get("initContainerStatuses") or ():
            if (cs.get("state") or {}).get("running"):
                init = str(cs.get("name"))
                what = (" (downloading the model)" if init == "model-download" else
                        " (downloading a LoRA adapter)" if init.startswith("lora-download-") else
                        " (downloading the draft model)" if init == "draft-download" else "")
                out.not_ready.append(f"{name}: init container {cs.get('name')} running{what}")
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in BAD_CONTAINER_STATES:
                msg = f"{name}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
                out.broken.append(msg + _last_exit(cs))
    return out


def _deployment_condition(dep: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return get_condition(dep.get("status"), type_)


def _surging(workload: dict[str, Any], want: int, total: int) -> bool:
    """A rollout that adds pods before it removes old ones is under way (a Deployment whose
    strategy surges, holding more pods than it wants)."""
    rolling = ((workload.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    return str(rolling.get("maxSurge", 0)) not in ("0", "0%") and total > want


def _surge_blocked(ready: int, scheduler: str) -> str:
    return (
        f"the rollout waits: a surge pod of the new spec cannot be scheduled ({scheduler}); "
        f"{ready} ready replica(s) of the previous spec keep serving until it can. To replace "
        "pods in place instead (the service is down while a one-replica pod restarts), set "
        "spec.rollout.whenSurgeBlocked: ReplaceInPlace, or spec.rollout.maxSurge: 0 and "
        "maxUnavailable: 1"
    )


def verdict(
    spec: dict[str, Any],
    deployment: dict[str, Any],
    pods: list[dict[str, Any]],
    gpu_nodes: int | None,
) -> Verdict:
    """The rollout's state, given a Deployment that carries the resource's latest generation."""
    want = int(deployment["spec"].get("replicas", 1))
    st = deployment.get("status") or {}
    observed = deployment["metadata"].get("generation") == st.get("observedGeneration")
    total, updated, ready = (
        int(st.get(k) or 0) for k in ("replicas", "updatedReplicas", "readyReplicas")
    )
    progress = f"{updated}/{want} updated, {ready}/{want} ready, {total} total"
    if want == 0:
        return Verdict(False, False, False, "ScaledToZero", "spec.replicas is 0")
    if observed and updated == want and total == want and ready == want:
        return Verdict(True, False, False, "RolloutComplete", f"{ready}/{want} replicas ready")
    unschedulable, broken, not_ready, terminating = pod_problems(pods)
    gpu = (spec.get("gpu") or {}).get("resourceName", "nvidia.com/gpu")
    gpu_enabled = (spec.get("gpu") or {}).get("enabled", True)
    if gpu_enabled and gpu_nodes == 0:
        msg = f"no node advertises {gpu}" + (
            f"; scheduler: {unschedulable[0]}" if unschedulable else ""
        )
        return Verdict(False, False, True, INSUFFICIENT_GPU, msg)
    notes = deployment["metadata"].get("annotations") or {}
    falling_back = notes.get(ANNOTATION_IN_PLACE) == notes.get(ANNOTATION_GENERATION)
    if unschedulable and falling_back and (ready or terminating):
        return Verdict(False, True, False, "RollingOut", progress + "; no room for a surge pod: "
                       "replacing pods in place (spec.rollout.whenSurgeBlocked: ReplaceInPlace)")
    if unschedulable and ready and _surging(deployment, want, total):
        return Verdict(False, False, True, SURGE_BLOCKED, _surge_blocked(ready, unschedulable[0]))
    if unschedulable and not terminating:
        if gpu_enabled and gpu in unschedulable[0]:
            return Verdict(False, False, True, INSUFFICIENT_GPU, unschedulable[0])
        return Verdict(False, False, True, "Unschedulable", unschedulable[0])
    if broken:
        return Verdict(False, True, True, broken[0].split(": ")[1], "; ".join(broken))
    stalled = _deployment_condition(deployment, "Progressing")
    if stalled and stalled.get("reason") == "ProgressDeadlineExceeded":
        return Verdict(
            False, False, True, "ProgressDeadlineExceeded", stalled.get("message", progress)
        )
    failure = _deployment_condition(deployment, "ReplicaFailure")
    if failure and failure.get("status") == "True":
        return Verdict(False, True, True, "ReplicaFailure", failure.get("message", ""))
    if unschedulable:
        progress += "; waiting for terminating pods to release their GPUs"
    if not_ready:
        progress += "; " + "; ".join(not_ready[:3])
    return Verdict(False, True, False, "RollingOut", progress)


def compute_status(
    resource: dict[str, Any],
    deployment: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    gpu_nodes: int | None = None,
    now: str | None = None,
) -> dict[str, Any]:
    """The resource's new `status`. A reconciler's verdict for the current generation (InvalidSpec,
    ModelConfigUnavailable) stands until a Deployment of that generation exists; only the counts
    move."""
    now = now or now_iso()
    meta, spec, prev = (
        resource["metadata"],
        resource.get("spec") or {},
        resource.get("status") or {},
    )
    generation = int(meta.get("generation") or 1)
    port = (spec.get("service") or {}).get("port", 8000)
    # with spec.router on, clients go through it (router.py names it NAME-router)
    host = f"{meta['name']}-router" if (spec.get("router") or {}).get("enabled") else meta["name"]
    status: dict[str, Any] = {
        "endpoint": f"http://{host}.{meta.get('namespace', 'default')}.svc:{port}/v1",
        "selector": selector_string(meta["name"]),
    }
    for key in ("tensorParallelSize", "gpusPerReplica"):
        if key in prev:
            status[key] = prev[key]
    dep_generation = generation
    if deployment is not None:
        st, notes = deployment.get("status") or {}, deployment["metadata"].get("annotations") or {}
        status.update(
            replicas=int(st.get("replicas") or 0),
            readyReplicas=int(st.get("readyReplicas") or 0),
            updatedReplicas=int(st.get("updatedReplicas") or 0),
        )
        if ANNOTATION_TP in notes:
            status["tensorParallelSize"] = int(notes[ANNOTATION_TP])
            status["gpusPerReplica"] = int(notes.get(ANNOTATION_GPUS, notes[ANNOTATION_TP]))
        dep_generation = int(notes.get(ANNOTATION_GENERATION, 0))
    else:
        status.update(replicas=0, readyReplicas=0, updatedReplicas=0)

    ready_cond = get_condition(prev, READY)
    if (
        ready_cond
        and ready_cond.get("reason") in RECONCILER_REASONS
        and ready_cond.get("observedGeneration") == generation
        and (deployment is None or dep_generation != generation)
    ):
        status["conditions"] = prev["conditions"]
        status["observedGeneration"] = generation
        return status
    if deployment is None or dep_generation != generation:
        v = Verdict(False, True, False, "Reconciling", f"applying generation {generation}")
        observed = prev.get("observedGeneration", 0)
    else:
        v = verdict(spec, deployment, pods, gpu_nodes)
        observed = generation
    status["conditions"] = _conditions(prev, v, observed, now)
    status["observedGeneration"] = observed
    return status


def blocked_status(
    resource: dict[str, Any], message: str, reason: str = INVALID_SPEC, now: str | None = None
) -> dict[str, Any]:
    """The reconciler's verdict when it cannot build this generation (`RECONCILER_REASONS`)."""
    generation = int(resource["metadata"].get("generation") or 1)
    prev = resource.get("status") or {}
    v = Verdict(False, False, True, reason, message)
    return {
        "conditions": _conditions(prev, v, generation, now or now_iso()),
        "observedGeneration": generation,
    }


def problem_reason(status: dict[str, Any]) -> str | None:
    """The reason of a True Degraded condition, if any."""
    c = get_condition(status, DEGRADED)
    return c.get("reason") if c and c.get("status") == "True" else None


def is_ready(status: dict[str, Any] | None) -> bool:
    c = get_condition(status, READY)
    return bool(c and c.get("status") == "True")
