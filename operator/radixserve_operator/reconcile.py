"""What the handlers do, over a `ClusterClient`: apply the desired objects for a resource, and
recompute its status from what exists. Level-based: both may run any number of times."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from radixserve_operator import API_VERSION, KIND, LABEL_INSTANCE
from radixserve_operator.builders import build_all, gpus_per_replica, selector_labels
from radixserve_operator.client import ApplyRejected, ClusterClient
from radixserve_operator.modelconfig import (
    ModelConfigNotFound,
    ModelConfigUnavailable,
    fetch_config,
    resolve_shape,
)
from radixserve_operator.sizing import SizingError, resolve_tp
from radixserve_operator.spec import ServiceSpec, SpecError, parse_spec
from radixserve_operator.status import (
    INVALID_SPEC,
    READY,
    compute_status,
    get_condition,
    invalid_status,
    is_ready,
    problem_reason,
)

log = logging.getLogger(__name__)
Fetch = Callable[[str, "str | None"], dict[str, Any]]


class RetryLater(RuntimeError):
    """A transient failure (hub unreachable); the handler raises kopf.TemporaryError."""


def _mark_invalid(client: ClusterClient, body: dict[str, Any], message: str) -> None:
    meta = body["metadata"]
    old = get_condition(body.get("status"), READY)
    generation = int(meta.get("generation") or 1)
    repeated = (
        old is not None
        and old.get("reason") == INVALID_SPEC
        and old.get("observedGeneration") == generation
        and old.get("message") == message
    )
    client.patch_status(meta["namespace"], meta["name"], invalid_status(body, message))
    if not repeated:  # a resume or a retry of the same generation says nothing new
        client.event(body, "Warning", INVALID_SPEC, message)
    log.error("%s/%s: invalid spec: %s", meta["namespace"], meta["name"], message)


def plan(
    body: dict[str, Any], fetch: Fetch = fetch_config
) -> tuple[ServiceSpec, int, list[dict[str, Any]]]:
    """The parsed spec, its TP size and the owned objects to apply. Raises SpecError, SizingError,
    ModelConfigNotFound (invalid spec) or ModelConfigUnavailable (retry later)."""
    import kopf

    spec = parse_spec(body)
    tp = resolve_tp(spec, resolve_shape(spec.model, fetch))
    objects = build_all(spec, tp, int(body["metadata"].get("generation") or 1))
    kopf.adopt(objects, owner=body)
    return spec, tp, objects


def reconcile(
    client: ClusterClient,
    body: dict[str, Any],
    fetch: Fetch = fetch_config,
    announce: tuple[str, str] | None = None,
) -> int | None:
    """Apply the Deployment and Service for `body`; returns the TP size, or None when the spec is
    invalid (status and a Warning event say why; no retry until the spec changes). `announce`:
    (reason, message prefix) of a Normal event to post once applied."""
    try:
        spec, tp, objects = plan(body, fetch)
    except ModelConfigUnavailable as e:
        client.event(body, "Warning", "ModelConfigUnavailable", str(e))
        raise RetryLater(str(e)) from None
    except (SpecError, SizingError, ModelConfigNotFound, ValueError) as e:
        _mark_invalid(client, body, str(e))
        return None
    try:
        for obj in objects:
            client.apply(obj)
    except ApplyRejected as e:
        _mark_invalid(client, body, str(e))
        return None
    client.patch_status(
        spec.namespace,
        spec.name,
        {"tensorParallelSize": tp, "gpusPerReplica": gpus_per_replica(spec, tp)},
    )
    if announce:
        reason, prefix = announce
        gpus = f"{tp} x {spec.gpu.resource_name}" if spec.gpu.enabled else "CPU"
        client.event(
            body,
            "Normal",
            reason,
            f"{prefix}: {spec.model.source}, TP {tp} ({gpus}), {spec.replicas} replica(s)",
        )
    refresh(client, spec.namespace, spec.name)
    return tp


def refresh(client: ClusterClient, namespace: str, name: str) -> dict[str, Any] | None:
    """Recompute the resource's status from its Deployment and pods; patch it when it changed and
    post an event on the transitions that matter (rollout done, a new problem)."""
    resource = client.get(API_VERSION, KIND, namespace, name)
    if resource is None or resource["metadata"].get("deletionTimestamp"):
        return None
    deployment = client.get("apps/v1", "Deployment", namespace, name)
    pods = client.list_pods(namespace, selector_labels(name)) if deployment else []
    gpu = (resource.get("spec") or {}).get("gpu") or {}
    pending = any((p.get("status") or {}).get("phase") == "Pending" for p in pods)
    gpu_nodes = (
        client.count_gpu_nodes(gpu.get("resourceName", "nvidia.com/gpu"))
        if pending and gpu.get("enabled", True)
        else None
    )
    old = resource.get("status") or {}
    new = compute_status(resource, deployment, pods, gpu_nodes)
    if all(old.get(k) == v for k, v in new.items()):
        return new
    client.patch_status(namespace, name, new)
    if is_ready(new) and not is_ready(old):
        client.event(resource, "Normal", "RolloutComplete", get_condition(new, READY)["message"])
    problem = problem_reason(new)
    if problem and problem != problem_reason(old) and problem != INVALID_SPEC:
        client.event(resource, "Warning", problem, get_condition(new, READY)["message"])
    return new


def refresh_owner(client: ClusterClient, child: dict[str, Any], deleted: bool = False) -> None:
    """A Deployment or pod of ours changed: refresh its InferenceService (and re-create the
    Deployment when someone deleted it while the resource lives on)."""
    meta = child.get("metadata") or {}
    name, namespace = (meta.get("labels") or {}).get(LABEL_INSTANCE), meta.get("namespace")
    if not name or not namespace:
        return
    if deleted and child.get("kind") == "Deployment":
        owner = client.get(API_VERSION, KIND, namespace, name)
        if owner is not None and not owner["metadata"].get("deletionTimestamp"):
            reconcile(client, owner)
            return
    refresh(client, namespace, name)
