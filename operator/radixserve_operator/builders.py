"""Pure builders: a parsed `ServiceSpec` (+ its TP size and generation) -> the Deployment and the
Service that serve it. No cluster access; owner references are added by the handlers."""

from __future__ import annotations

import re
from typing import Any

from radixserve_operator import (
    ANNOTATION_GENERATION,
    ANNOTATION_GPUS,
    ANNOTATION_TP,
    APP_NAME,
    FIELD_MANAGER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_VERSION,
    SERVER_PORT,
)
from radixserve_operator.spec import ProbeTiming, ServiceSpec

CONTAINER = "server"
CACHE_DIR = "/models-cache"
SOURCE_DIR = "/models"  # pvc:// sources mount at /models/CLAIM
RUN_AS = 1000
GRACE_MARGIN_S = 15  # beyond the server's drain timeout, before SIGKILL
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def selector_labels(name: str) -> dict[str, str]:
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def labels(spec: ServiceSpec) -> dict[str, str]:
    out = {
        **selector_labels(spec.name),
        LABEL_COMPONENT: "inference",
        LABEL_PART_OF: APP_NAME,
        LABEL_MANAGED_BY: FIELD_MANAGER,
    }
    tag = spec.image.rsplit(":", 1)[-1] if ":" in spec.image.rsplit("/", 1)[-1] else ""
    if _LABEL_VALUE.match(tag):
        out[LABEL_VERSION] = tag
    return out


def endpoint(spec: ServiceSpec) -> str:
    return f"http://{spec.name}.{spec.namespace}.svc:{spec.service_port}/v1"


def model_arg(spec: ServiceSpec) -> str | None:
    """What `--model` gets: None for the embedded default, the path inside the pod for pvc://."""
    if spec.model.is_default:
        return None
    pvc = spec.model.pvc
    return f"{SOURCE_DIR}/{pvc[0]}/{pvc[1]}" if pvc else spec.model.source


def server_args(spec: ServiceSpec, tp: int) -> list[str]:
    rt = spec.runtime
    args = ["serve"]
    model = model_arg(spec)
    if model is not None:
        args += ["--model", model]
    args += ["--tp", str(tp), "--host", "0.0.0.0", "--port", str(SERVER_PORT)]
    if not spec.gpu.enabled:
        args += ["--device", "cpu"]
    optional = [
        ("--served-model-name", spec.model.served_name),
        ("--dtype", rt.dtype),
        ("--page-size", rt.page_size),
        ("--max-running-requests", rt.max_running_requests),
        ("--max-prefill-length", rt.max_prefill_length),
        ("--memory-ratio", rt.memory_ratio),
        ("--cuda-graph-max-bs", rt.cuda_graph_max_bs),
        ("--attn", rt.attention),
        ("--cache", rt.cache),
        ("--shutdown-timeout", rt.shutdown_timeout),
    ]
    for flag, value in optional:
        if value is not None:
            args += [flag, str(value)]
    return args + list(rt.extra_args)


def _probe(timing: ProbeTiming) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "initialDelaySeconds": timing.initial_delay,
        "periodSeconds": timing.period,
        "timeoutSeconds": timing.timeout,
        "failureThreshold": timing.failure_threshold,
    }


def _resources(spec: ServiceSpec, tp: int) -> dict[str, Any]:
    out = {k: dict(v) for k, v in spec.resources.items() if k in ("limits", "requests")}
    gpu = spec.gpu.resource_name
    for part in out.values():
        part.pop(gpu, None)
    if spec.gpu.enabled:
        out.setdefault("limits", {})[gpu] = tp  # extended resources: requests default to limits
    return out


def _env(spec: ServiceSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "RADIXSERVE_CACHE_DIR", "value": CACHE_DIR},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "HOME", "value": "/tmp"},  # read-only root: libraries cache under $HOME
    ]
    if spec.model.revision:
        env.append({"name": "RADIXSERVE_MODEL_REVISION", "value": spec.model.revision})
    if spec.api_key_secret:
        name, key = spec.api_key_secret
        env.append(
            {
                "name": "RADIXSERVE_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": name, "key": key}},
            }
        )
    return merge_env(env, spec.env)


def merge_env(base: list[dict[str, Any]], user: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """`base` then `user`, one entry per name, the user's value winning, in first-seen order. A
    container's env is a map keyed by name for server-side apply: a repeated name is an HTTP 500
    there, never a usable pod."""
    merged: dict[str, dict[str, Any]] = {}
    for e in [*base, *user]:
        merged[e["name"]] = dict(e)
    return list(merged.values())


def _volumes(spec: ServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if spec.cache_pvc:
        cache: dict[str, Any] = {"persistentVolumeClaim": {"claimName": spec.cache_pvc}}
    else:
        cache = {"emptyDir": {"sizeLimit": spec.cache_size} if spec.cache_size is not None else {}}
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        {"name": "model-cache", **cache},
        {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}},
    ]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model-cache", "mountPath": CACHE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    pvc = spec.model.pvc
    if pvc:
        volumes.append(
            {
                "name": "model-source",
                "persistentVolumeClaim": {"claimName": pvc[0], "readOnly": True},
            }
        )
        mounts.append(
            {"name": "model-source", "mountPath": f"{SOURCE_DIR}/{pvc[0]}", "readOnly": True}
        )
    return volumes, mounts


def _strategy(spec: ServiceSpec) -> dict[str, Any]:
    r = spec.rollout
    if r.strategy == "Recreate":
        return {"type": "Recreate"}
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": r.max_surge, "maxUnavailable": r.max_unavailable},
    }


def _container(spec: ServiceSpec, tp: int, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["radixserve"],
        "args": server_args(spec, tp),
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec, tp),
        "volumeMounts": mounts,
        "startupProbe": _probe(spec.startup),
        "readinessProbe": _probe(spec.readiness),
        "livenessProbe": _probe(spec.liveness),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _pod_spec(spec: ServiceSpec, tp: int) -> dict[str, Any]:
    volumes, mounts = _volumes(spec)
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,  # the server never talks to the API server
        "terminationGracePeriodSeconds": spec.runtime.shutdown_timeout + GRACE_MARGIN_S,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(spec, tp, mounts)],
        "volumes": volumes,
    }
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.affinity:
        pod["affinity"] = spec.affinity
    return pod


def gpus_per_replica(spec: ServiceSpec, tp: int) -> int:
    return tp if spec.gpu.enabled else 0


def build_deployment(spec: ServiceSpec, tp: int, generation: int) -> dict[str, Any]:
    """The Deployment for `spec` at TP `tp`; `generation` (the resource's metadata.generation) is
    recorded so status can tell whether the Deployment already carries the latest spec."""
    lbl = labels(spec)
    # A rollout may wait out a whole startup window per pod; don't call it stalled before that.
    deadline = max(600, spec.startup.window_seconds + 300)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": lbl,
            "annotations": {
                ANNOTATION_GENERATION: str(generation),
                ANNOTATION_TP: str(tp),
                ANNOTATION_GPUS: str(gpus_per_replica(spec, tp)),
            },
        },
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(spec.name)},
            "strategy": _strategy(spec),
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": deadline,
            "template": {
                "metadata": {
                    "labels": {**spec.pod_labels, **lbl},
                    "annotations": {
                        "kubectl.kubernetes.io/default-container": CONTAINER,
                        **spec.pod_annotations,
                    },
                },
                "spec": _pod_spec(spec, tp),
            },
        },
    }


def build_service(spec: ServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels(spec)},
        "spec": {
            "type": spec.service_type,
            "selector": selector_labels(spec.name),
            "ports": [
                {"name": "http", "port": spec.service_port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def build_all(spec: ServiceSpec, tp: int, generation: int) -> list[dict[str, Any]]:
    return [build_deployment(spec, tp, generation), build_service(spec)]
