"""What the handlers do, over a `ClusterClient`: apply the desired objects for a resource, and
recompute its status from what exists. Level-based: both may run any number of times, from any
thread; status writes for one resource are serialised here and carry the resourceVersion they
were computed from, so a stale verdict can never land last. A reconcile holds the resource's lock
from its first write to its last, so no refresh (a pod or Deployment event, on another thread)
reports a generation Ready before that generation's own conditions are written."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from radixserve_operator import ANNOTATION_IN_PLACE, API_VERSION, KIND, LABEL_INSTANCE
from radixserve_operator.builders import gpus_per_replica, selector_labels, workload_kind_of
from radixserve_operator.children import OPTIONAL_KINDS, build_all
from radixserve_operator.client import (
    APIUnavailable,
    ApplyRejected,
    ClusterClient,
    StatusConflict,
)
from radixserve_operator.images import check_images
from radixserve_operator.modelconfig import (
    ModelConfigNotFound,
    ModelConfigUnavailable,
    ModelShape,
    fetch_config,
    resolve_shape,
)
from radixserve_operator.ownership import NAME_CONFLICT, conflicts
from radixserve_operator.podsecurity import check_pod_template
from radixserve_operator.quantity import quantity_bytes
from radixserve_operator.references import check_references
from radixserve_operator.router import ROUTER_KINDS, router_name
from radixserve_operator.settings import OperatorSettings
from radixserve_operator.spec import ServiceSpec, SpecError, parse_spec
from radixserve_operator.status import (
    AUTOSCALING,
    CACHE_SHARED_RWO,
    INVALID_SPEC,
    MODEL_CONFIG_UNAVAILABLE,
    READY,
    RECONCILER_REASONS,
    SURGE_BLOCKED,
    blocked_status,
    compute_status,
    get_condition,
    is_ready,
    now_iso,
    pod_problems,
    problem_reason,
)
from radixserve_operator.tp_plan import SizingError, resolve_tp

log = logging.getLogger(__name__)
Fetch = Callable[[str, "str | None"], dict[str, Any]]
STATUS_ATTEMPTS = 5
RETRY_DELAY_S = 60  # the handlers' kopf.TemporaryError delay
APPLY_FAILED = "ApplyFailed"  # the API server refused a write for a reason a retry may cure
GPU_NODES_TTL_S = 60.0  # a node list per resource event would not scale; GPUs rarely come and go


class RetryLater(RuntimeError):
    """A transient failure (hub unreachable); the handler raises kopf.TemporaryError."""


class Refused(RuntimeError):
    """This generation cannot be applied (an invalid spec, a name another object holds); the
    status and a Warning event say why. The handler raises kopf.PermanentError: nothing is
    retried until the spec changes (the resync looks again at what the cluster may change)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


_locks: dict[tuple[str, str], threading.RLock] = {}
_locks_guard = threading.Lock()
_gpu_nodes: dict[str, tuple[float, int | None]] = {}
# (kind, namespace, name) -> the generation of the workload (Deployment or StatefulSet) we wrote
_applied: dict[tuple[str, str, str], int] = {}
# (namespace, name) -> (uid, generation) whose objects the API server has validated and stored
_validated: dict[tuple[str, str], tuple[Any, Any]] = {}
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
SHAREABLE_MODES = ("ReadWriteMany", "ReadOnlyMany")


def _lock(namespace: str, name: str) -> threading.RLock:
    """Reentrant: a reconcile holds it while the status writers it calls take it again."""
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.RLock())


def _count_gpu_nodes(client: ClusterClient, resource_name: str) -> int | None:
    now = time.monotonic()
    cached = _gpu_nodes.get(resource_name)
    if cached is None or now - cached[0] > GPU_NODES_TTL_S or cached[1] == 0:
        cached = (now, client.count_gpu_nodes(resource_name))
        _gpu_nodes[resource_name] = cached
    return cached[1]


def _mark_blocked(
    client: ClusterClient, body: dict[str, Any], message: str, reason: str = INVALID_SPEC
) -> None:
    meta = body["metadata"]
    generation = int(meta.get("generation") or 1)
    with _lock(meta["namespace"], meta["name"]):
        current = client.get(API_VERSION, KIND, meta["namespace"], meta["name"]) or body
        old = get_condition(current.get("status"), READY)
        repeated = (
            old is not None
            and old.get("reason") == reason
            and old.get("observedGeneration") == generation
            and old.get("message") == message
        )
        if not repeated:
            client.patch_status(meta["namespace"], meta["name"], blocked_status(current, message, reason))
    if not repeated:  # a resume, a resync or a retry of the same generation says nothing new
        client.event(body, "Warning", reason, message)
    log.error("%s/%s: %s: %s", meta["namespace"], meta["name"], reason, message)


def _shape(spec: ServiceSpec, fetch: Fetch) -> tuple[ModelShape | None, str | None]:
    """The model's shape for sizing, and why it is unknown when the deployment can go ahead
    without it: an explicit TP needs no hub (air-gapped or gated models deploy), `auto` does."""
    if not spec.gpu.enabled:
        return None, None  # a CPU replica runs TP 1 whatever the model
    try:
        return resolve_shape(spec.model, fetch), None
    except (ModelConfigUnavailable, ModelConfigNotFound) as e:
        if spec.tensor == "auto":
            raise
        return None, str(e)


def check_policy(
    spec: ServiceSpec, objects: list[dict[str, Any]], settings: OperatorSettings
) -> None:
    """Every pod the objects would run, against the operator's Pod Security level; the server's,
    which carries what the resource asks for, against the allow-lists too (another workload's
    ServiceAccount, the router's, is the operator's own). Raises PodSecurityError or
    ReferenceNotAllowed (SpecErrors naming the pod's fields)."""
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS:
            template = obj["spec"]["template"]
            check_pod_template(template, settings.pod_security_level)
            if obj["metadata"]["name"] == spec.name:
                check_references(template["spec"], spec, settings)


def plan(
    body: dict[str, Any],
    fetch: Fetch = fetch_config,
    settings: OperatorSettings | None = None,
    in_place: bool = False,
) -> tuple[ServiceSpec, int, list[dict[str, Any]], str | None]:
    """The parsed spec, its TP size, the owned objects to apply and why the TP size could not be
    checked against the model (None when it was). Raises SpecError (PodSecurityError and
    ReferenceNotAllowed among them), SizingError, ModelConfigNotFound (invalid spec) or
    ModelConfigUnavailable (retry later). `settings`: the operator's (default: its environment);
    `in_place`: this generation rolls out in place (`replacing_in_place`)."""
    import kopf

    settings = settings or OperatorSettings.from_env()
    spec = parse_spec(body, settings)
    check_images(body.get("spec") or {}, settings)
    shape, unchecked = _shape(spec, fetch)
    tp = resolve_tp(spec, shape)
    generation = int(body["metadata"].get("generation") or 1)
    objects = build_all(spec, tp, generation, settings, in_place)
    check_policy(spec, objects, settings)  # before anything is applied
    kopf.adopt(objects, owner=body)
    return spec, tp, objects, unchecked


def reconcile(
    client: ClusterClient,
    body: dict[str, Any],
    fetch: Fetch = fetch_config,
    announce: tuple[str, str] | None = None,
) -> int | None:
    """Apply the Deployment and Service for `body`; returns the TP size. Raises Refused when this
    generation cannot be applied (status and a Warning event say why), RetryLater when the hub is
    unreachable. `announce`: (reason, message prefix) of a Normal event to post once applied."""
    try:
        spec, tp, objects, unchecked = plan(body, fetch, in_place=replacing_in_place(client, body))
    except ModelConfigUnavailable as e:
        message = (
            f"{e}; with spec.parallelism.tensor set (or spec.model.parameters), the model "
            f"deploys without reading its config from the hub"
        )
        _mark_blocked(client, body, message, MODEL_CONFIG_UNAVAILABLE)
        raise RetryLater(message) from None
    except (SpecError, SizingError, ModelConfigNotFound) as e:
        _refuse(client, body, str(e), getattr(e, "reason", INVALID_SPEC))
    except Exception as e:
        log.exception("%s/%s: planning failed", body["metadata"].get("namespace"),
                      body["metadata"].get("name"))
        _refuse(client, body, f"the operator cannot plan this spec ({type(e).__name__}: "
                f"{str(e)[:300]})", INVALID_SPEC)
    with _lock(spec.namespace, spec.name):
        try:
            return _apply_plan(client, body, spec, tp, objects, unchecked, announce)
        except (Refused, RetryLater):
            raise
        except Exception as e:
            message = (f"applying failed ({type(e).__name__}: {str(e)[:300]}); retrying in "
                       f"{RETRY_DELAY_S} s")
            _mark_blocked(client, body, message, APPLY_FAILED)
            raise RetryLater(message) from e


def _falls_back(raw_spec: dict[str, Any]) -> bool:
    return (raw_spec.get("rollout") or {}).get("whenSurgeBlocked") == "ReplaceInPlace"


def _in_place_mark(deployment: dict[str, Any] | None) -> str | None:
    return ((deployment or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_IN_PLACE)


def replacing_in_place(client: ClusterClient, body: dict[str, Any]) -> bool:
    """Whether this generation rolls out in place: the spec falls back (rollout.whenSurgeBlocked:
    ReplaceInPlace) and its surge pod found no room (the status says SurgeBlocked for this
    generation), or the Deployment already carries that decision for it. Decided per generation,
    so the next spec change surges first again."""
    meta = body["metadata"]
    if not _falls_back(body.get("spec") or {}):
        return False
    generation = int(meta.get("generation") or 1)
    deployment = client.get("apps/v1", "Deployment", meta["namespace"], meta["name"])
    if _in_place_mark(deployment) == str(generation):
        return True
    live = client.get(API_VERSION, KIND, meta["namespace"], meta["name"]) or body
    ready = get_condition(live.get("status"), READY) or {}
    return ready.get("reason") == SURGE_BLOCKED and ready.get("observedGeneration") == generation


def _refuse(client: ClusterClient, body: dict[str, Any], message: str, reason: str) -> NoReturn:
    _mark_blocked(client, body, message, reason)
    raise Refused(message, reason)


def _apply_plan(
    client: ClusterClient,
    body: dict[str, Any],
    spec: ServiceSpec,
    tp: int,
    objects: list[dict[str, Any]],
    unchecked: str | None,
    announce: tuple[str, str] | None,
) -> int | None:
    """The writes of one reconcile, under the resource's lock (see the module's docstring)."""
    taken = conflicts(client, body, objects)  # before anything is written
    if taken:
        _refuse(
            client,
            body,
            "; ".join(taken) + ": rename this InferenceService (or the other object); nothing "
            "was applied",
            NAME_CONFLICT,
        )
    scaler_problem = None
    try:
        _dry_run(client, body, objects)  # the API server's own checks, before anything is written
        for obj in objects:
            if obj["kind"] == "StatefulSet" and _claims_changed(client, obj):
                _recreate_statefulset(client, body, obj)
                continue  # applied again once it is gone (its delete event, or the resync)
            try:
                out = client.apply(obj)
            except APIUnavailable as e:
                scaler_problem = _missing_api_message(obj, e)
                continue
            if obj["kind"] in WORKLOAD_KINDS:
                key = (obj["kind"], spec.namespace, obj["metadata"]["name"])  # NAME-router too
                _applied[key] = int(out["metadata"].get("generation") or 0)
    except ApplyRejected as e:
        _refuse(client, body, str(e), INVALID_SPEC)
    meta = body["metadata"]
    _validated[(spec.namespace, spec.name)] = (meta.get("uid"), meta.get("generation"))
    _delete_unwanted(client, body, objects)
    _set_autoscaling_condition(client, body, spec, scaler_problem)
    _set_cache_condition(client, body, spec)
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
        if unchecked:
            client.event(
                body, "Warning", "TPUnchecked", f"TP {tp} not checked against the model: {unchecked}"
            )
        if spec.exposed and spec.allow_unauthenticated and not spec.api_key_secret:
            client.event(body, "Warning", "UnauthenticatedService", _open_service(spec))
        legacy = (body.get("spec") or {}).get("modelCache")
        if spec.cache.deprecated_field and legacy != LEGACY_DEFAULT_CACHE:
            client.event(body, "Warning", "DeprecatedField", _deprecation(legacy))
    refresh(client, spec.namespace, spec.name)
    return tp


# The operator's own objects, nothing of the resource's in them; and a RoleBinding's dry run needs
# its Role to exist already.
NOT_DRY_RUN = ("ServiceAccount", "Role", "RoleBinding")


def _dry_run(client: ClusterClient, body: dict[str, Any], objects: list[dict[str, Any]]) -> None:
    """Every object through the API server's validation and admission, nothing stored, once per
    generation: a spec whose NetworkPolicy peer or pod field the API server refuses gets nothing
    applied, rather than a Deployment and Service without the rest. Raises ApplyRejected."""
    meta = body["metadata"]
    if _validated.get((meta["namespace"], meta["name"])) == (meta.get("uid"), meta.get("generation")):
        return
    for obj in objects:
        if obj["kind"] in NOT_DRY_RUN or (
            obj["kind"] == "StatefulSet" and _claims_changed(client, obj)
        ):  # a claim template change is refused in place: the StatefulSet is recreated
            continue
        try:
            client.apply(obj, dry_run=True)
        except APIUnavailable:
            continue  # said when applying (KEDA not installed)


def _open_service(spec: ServiceSpec) -> str:
    return (
        f"Service {spec.name} is a {spec.service_type} without an API key "
        "(spec.service.allowUnauthenticated): anyone who can reach it can use the model; set "
        "spec.apiKeySecretRef to require a key"
    )


# What the API server stored in spec.modelCache of resources created before model.cache existed.
LEGACY_DEFAULT_CACHE = {"emptyDir": {"sizeLimit": "100Gi"}}


def _deprecation(legacy: dict[str, Any]) -> str:
    if "pvc" in legacy:
        new = f"{{type: sharedPVC, claimName: {legacy['pvc']['claimName']}}}"
    else:
        new = f"{{type: emptyDir, sizeLimit: {(legacy.get('emptyDir') or {}).get('sizeLimit', '100Gi')}}}"
    return f"spec.modelCache is deprecated: set spec.model.cache to {new} instead"


def _claim_key(template: dict[str, Any]) -> tuple[Any, ...]:
    s, meta = template.get("spec") or {}, template.get("metadata") or {}
    storage = ((s.get("resources") or {}).get("requests") or {}).get("storage", 0)
    return (
        meta.get("name"),
        quantity_bytes(storage),
        s.get("storageClassName"),
        tuple(sorted(s.get("accessModes") or ())),
        tuple(sorted((meta.get("labels") or {}).items())),
    )


def _claims_changed(client: ClusterClient, desired: dict[str, Any]) -> bool:
    """Whether a live StatefulSet's volumeClaimTemplates (which the API server refuses to change)
    differ from the desired ones in what the spec sets. A class the cluster defaulted on the live
    side (no storageClassName asked for) is no change."""
    meta = desired["metadata"]
    live = client.get("apps/v1", "StatefulSet", meta["namespace"], meta["name"])
    if live is None or (live.get("metadata") or {}).get("deletionTimestamp"):
        return False
    want = [_claim_key(t) for t in desired["spec"]["volumeClaimTemplates"]]
    have = [_claim_key(t) for t in (live.get("spec") or {}).get("volumeClaimTemplates") or ()]
    if len(want) != len(have):
        return True
    return any(
        w[:2] != h[:2] or w[3:] != h[3:] or (w[2] is not None and w[2] != h[2])
        for w, h in zip(want, have, strict=True)
    )


def _recreate_statefulset(client: ClusterClient, body: dict[str, Any], obj: dict[str, Any]) -> None:
    """Delete the StatefulSet leaving its pods and PVCs (orphan): the new one adopts the pods
    (rolling them if their template changed) and gives the new claim template to new replicas."""
    meta = obj["metadata"]
    client.delete("apps/v1", "StatefulSet", meta["namespace"], meta["name"], orphan=True)
    client.event(
        body,
        "Normal",
        "CacheClaimsChanged",
        f"model.cache changed: recreating StatefulSet {meta['name']} (its pods keep running); "
        "replicas that have a PVC already keep it as it is: expand it where the StorageClass "
        "allows, or delete it so that the pod gets a new one",
    )
    log.info("%s/%s: cache claim template changed: StatefulSet recreated", meta["namespace"], meta["name"])


def _missing_api_message(obj: dict[str, Any], error: Exception) -> str:
    if obj["apiVersion"].startswith("keda.sh/"):
        return (
            f"{error}: install KEDA (https://keda.sh) for spec.autoscaling.engine keda, or use "
            "engine hpa; until then spec.replicas stays as set"
        )
    return str(error)


def _delete_unwanted(client: ClusterClient, body: dict[str, Any], objects: list[dict[str, Any]]) -> None:
    """Delete the optional children of ours (owner reference to this resource) that the spec no
    longer asks for: a PDB for one replica, an autoscaler the user removed or swapped."""
    meta = body["metadata"]
    wanted = {(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in objects}
    router = router_name(meta["name"])
    candidates = [(a, k, meta["name"]) for a, k in OPTIONAL_KINDS] + [(a, k, router) for a, k in ROUTER_KINDS]
    for api_version, kind, name in candidates:
        if (api_version, kind, name) in wanted:
            continue
        found = client.get(api_version, kind, meta["namespace"], name)
        refs = ((found or {}).get("metadata") or {}).get("ownerReferences") or ()
        if any(r.get("uid") == meta.get("uid") and r.get("controller") for r in refs):
            client.delete(api_version, kind, meta["namespace"], name)
            log.info("%s/%s: deleted %s %s (no longer in the spec)", meta["namespace"], meta["name"], kind, name)


def _set_autoscaling_condition(
    client: ClusterClient, body: dict[str, Any], spec: ServiceSpec, problem: str | None
) -> None:
    """The `Autoscaling` condition: True when the HPA or ScaledObject is applied, False with the
    reason when it cannot be (KEDA not installed); absent without spec.autoscaling."""
    meta = body["metadata"]
    a = spec.autoscaling
    new: dict[str, Any] | None = None
    if a is not None:
        kind = "HorizontalPodAutoscaler" if a.engine == "hpa" else "ScaledObject"
        new = {
            "type": AUTOSCALING,
            "status": "False" if problem else "True",
            "reason": ("KEDANotInstalled" if a.engine == "keda" else "APIUnavailable")
            if problem
            else f"{kind}Applied",
            "message": problem
            or f"{kind} {spec.name}: {a.min_replicas}-{a.max_replicas} replicas on "
            f"{a.metric_name} (target {a.target:g} per pod)",
            "observedGeneration": int(meta.get("generation") or 1),
        }
    old = _put_condition(client, body, AUTOSCALING, new)
    if new is not None and problem and (old is None or old.get("message") != problem):
        client.event(body, "Warning", new["reason"], problem)


def _put_condition(
    client: ClusterClient, body: dict[str, Any], type_: str, new: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Write condition `type_` (None: remove it) when it changed; returns the one it replaced.
    `lastTransitionTime` moves only when the status flips."""
    meta = body["metadata"]
    # The live status, not the handler's body: a body may predate the condition's last write.
    with _lock(meta["namespace"], meta["name"]):
        current = client.get(API_VERSION, KIND, meta["namespace"], meta["name"]) or body
        conditions = list((current.get("status") or {}).get("conditions") or ())
        old = get_condition(current.get("status"), type_)
        if new is not None:
            same = old is not None and old.get("status") == new["status"]
            new["lastTransitionTime"] = old.get("lastTransitionTime") if same else now_iso()
        if old == new or (old is None and new is None):
            return old
        rest = [c for c in conditions if c.get("type") != type_]
        client.patch_status(meta["namespace"], meta["name"], {"conditions": rest + ([new] if new else [])})
    return old


def cache_condition(
    spec: ServiceSpec, claim: dict[str, Any] | None, generation: int
) -> dict[str, Any] | None:
    """The `CacheSharedReadWriteOnce` condition of a sharedPVC cache, from the claim's access
    modes (the bound volume's, else the ones asked for): True when more than one pod may mount a
    claim no two nodes (ReadWriteOnce) or no two pods (ReadWriteOncePod) can share — replicas > 1,
    an autoscaler's maximum > 1, or a surge pod during a rollout. None without a shared claim."""
    c = spec.cache
    if c.type != "sharedPVC":
        return None
    out: dict[str, Any] = {"type": CACHE_SHARED_RWO, "observedGeneration": generation}
    if claim is None:
        return out | {
            "status": "Unknown",
            "reason": "ClaimNotFound",
            "message": f"PersistentVolumeClaim {c.claim_name} not found in {spec.namespace}: the "
            "pods wait for it",
        }
    st = claim.get("status") or {}
    modes = list(st.get("accessModes") or (claim.get("spec") or {}).get("accessModes") or ())
    surge = spec.rollout.strategy == "RollingUpdate" and str(spec.rollout.max_surge) not in ("0", "0%")
    pods = spec.may_run_replicas + (1 if surge else 0)
    if set(modes) & set(SHAREABLE_MODES) or pods <= 1:
        why = f"{', '.join(modes) or 'no access modes yet'}; at most {max(pods, 1)} pod(s) at once"
        return out | {"status": "False", "reason": "ClaimShareable", "message": why}
    who = f"up to {spec.may_run_replicas} replicas" + (" and a surge pod" if surge else "")
    return out | {
        "status": "True",
        "reason": "ReadWriteOnceClaimShared",
        "message": f"PersistentVolumeClaim {c.claim_name} is {', '.join(modes) or 'ReadWriteOnce'} "
        f"but {who} mount it: pods on different nodes cannot attach it (Multi-Attach). Use a "
        "ReadWriteMany claim (or ReadOnlyMany with readOnly), or model.cache type pvcPerReplica",
    }


def _set_cache_condition(client: ClusterClient, body: dict[str, Any], spec: ServiceSpec) -> None:
    meta = body["metadata"]
    claim = None
    if spec.cache.type == "sharedPVC":
        claim = client.get("v1", "PersistentVolumeClaim", spec.namespace, spec.cache.claim_name or "")
    new = cache_condition(spec, claim, int(meta.get("generation") or 1))
    old = _put_condition(client, body, CACHE_SHARED_RWO, new)
    if new is not None and new["status"] == "True" and (
        old is None or old.get("status") != "True" or old.get("message") != new["message"]
    ):
        client.event(body, "Warning", new["reason"], new["message"])


def refresh(client: ClusterClient, namespace: str, name: str) -> dict[str, Any] | None:
    """Recompute the resource's status from its Deployment and pods; patch it when it changed and
    post an event on the transitions that matter (rollout done, a new problem)."""
    with _lock(namespace, name):
        for _ in range(STATUS_ATTEMPTS):
            resource = client.get(API_VERSION, KIND, namespace, name)
            if resource is None or resource["metadata"].get("deletionTimestamp"):
                return None
            kind = workload_kind_of(resource.get("spec") or {})
            deployment = client.get("apps/v1", kind, namespace, name)
            pods = client.list_pods(namespace, selector_labels(name)) if deployment else []
            gpu = (resource.get("spec") or {}).get("gpu") or {}
            gpu_nodes = (
                _count_gpu_nodes(client, gpu.get("resourceName", "nvidia.com/gpu"))
                if gpu.get("enabled", True) and pod_problems(pods).unschedulable
                else None
            )
            old = resource.get("status") or {}
            new = compute_status(resource, deployment, pods, gpu_nodes)
            if all(old.get(k) == v for k, v in new.items()):
                return new
            try:
                client.patch_status(
                    namespace, name, new, resource["metadata"].get("resourceVersion")
                )
            except StatusConflict:
                continue  # someone wrote in between: read again, decide again
            break
        else:
            log.warning("%s/%s: status kept changing; the resync will retry", namespace, name)
            return None
    if is_ready(new) and not is_ready(old):
        client.event(resource, "Normal", "RolloutComplete", get_condition(new, READY)["message"])
    problem = problem_reason(new)
    if problem and problem != problem_reason(old) and problem not in RECONCILER_REASONS:
        client.event(resource, "Warning", problem, get_condition(new, READY)["message"])
    if (
        problem == SURGE_BLOCKED
        and _falls_back(resource.get("spec") or {})
        and _in_place_mark(deployment) != str(resource["metadata"].get("generation") or 1)
    ):
        client.event(resource, "Normal", "ReplacingInPlace", "no room for a surge pod: "
                     "replacing pods in place (spec.rollout.whenSurgeBlocked: ReplaceInPlace)")
        try:
            reconcile(client, resource)  # the Deployment, now in place, frees a replica's room
        except (RetryLater, Refused):
            pass  # the status says why
    return new


def _owner(client: ClusterClient, child: dict[str, Any]) -> dict[str, Any] | None:
    """The live InferenceService a child of ours belongs to."""
    meta = child.get("metadata") or {}
    name, namespace = (meta.get("labels") or {}).get(LABEL_INSTANCE), meta.get("namespace")
    if not name or not namespace:
        return None
    owner = client.get(API_VERSION, KIND, namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return None
    return owner


def _drifted(child: dict[str, Any], owner: dict[str, Any]) -> bool:
    """A workload edited by someone else (`kubectl scale` or `kubectl edit` of the child): a
    spec generation past the one this operator wrote, or replicas that are not the owner's."""
    meta = child.get("metadata") or {}
    written = _applied.get((child.get("kind"), meta.get("namespace"), meta.get("name")))
    if written is not None and int(meta.get("generation") or 0) > written:
        return True
    return (child.get("spec") or {}).get("replicas") != (owner.get("spec") or {}).get("replicas", 1)


def refresh_owner(client: ClusterClient, child: dict[str, Any], deleted: bool = False) -> None:
    """A workload, Service or pod of ours changed: re-apply the owner's children when one was
    deleted or edited by hand, else refresh the owner's status."""
    owner = _owner(client, child)
    if owner is None:
        return
    kind = child.get("kind")
    if (deleted and kind in (*WORKLOAD_KINDS, "Service")) or (
        not deleted and kind in WORKLOAD_KINDS and _drifted(child, owner)
    ):
        log.info("%s %s changed by hand: restoring it", kind, child["metadata"].get("name"))
        try:
            reconcile(client, owner)
        except (RetryLater, Refused):
            pass  # the owner's status says why; its own retry will apply
        return
    refresh(client, owner["metadata"]["namespace"], owner["metadata"]["name"])
