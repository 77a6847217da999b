"""The cache-aware front door of an InferenceService with `spec.router.enabled`: the SGLang model
gateway (`smg`, its own image: the Dockerfile's `router` target) as NAME-router, a Deployment and
a Service, with a ServiceAccount whose Role may only list and watch the pods of its namespace.

The gateway discovers the replicas itself (Kubernetes service discovery by label selector) and
adds a pod only while it is Running and Ready: the server's readiness probe passes once it serves,
so a replica gets traffic only after it can answer `/server_info`, and one that is terminating or
failing its probe gets none. The selector is the server's own (`selector_labels`), which the
router's pods do not carry (their `app.kubernetes.io/name` is another), so the gateway never
routes to itself and the server's Service never routes to the gateway. The router's pods carry
`radixserve.dev/component: router` and the resource's instance label: the server's NetworkPolicy
lets exactly them in. Pure: no cluster access; owner references are added by the handlers."""

from __future__ import annotations

from typing import Any

from radixserve_operator import (
    APP_NAME,
    COMPONENT_ROUTER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_RS_COMPONENT,
    SERVER_PORT,
)
from radixserve_operator.builders import secret_env, selector_labels
from radixserve_operator.spec import API_KEY_ENV, ServiceSpec

ROUTER_APP = f"{APP_NAME}-router"
ROUTER_PORT = 8000
METRICS_PORT = 29000
DEFAULT_ROUTER_IMAGE = "ghcr.io/radixserve/radixserve-router:0.1.0"
DEFAULT_ROUTER_RESOURCES = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "2Gi"},
}
# NOTE: the router's objects carry no managed-by label: the operator's watches select on it, and
# the router's Deployment (replicas of its own) would read as a hand-edited server workload. The
# resync re-applies them.
ROUTER_KINDS = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
)


def router_name(name: str) -> str:
    return f"{name}-router"


def router_selector(spec: ServiceSpec) -> dict[str, str]:
    return {LABEL_NAME: ROUTER_APP, LABEL_INSTANCE: spec.name}


def router_labels(spec: ServiceSpec) -> dict[str, str]:
    return {
        **router_selector(spec),
        LABEL_COMPONENT: COMPONENT_ROUTER,
        LABEL_PART_OF: APP_NAME,
        LABEL_RS_COMPONENT: COMPONENT_ROUTER,
    }


def _meta(spec: ServiceSpec) -> dict[str, Any]:
    return {"name": router_name(spec.name), "namespace": spec.namespace, "labels": router_labels(spec)}


def router_args(spec: ServiceSpec) -> list[str]:
    selector = [f"{k}={v}" for k, v in sorted(selector_labels(spec.name).items())]
    args = [
        "launch",
        "--host", "0.0.0.0",
        "--port", str(ROUTER_PORT),
        "--policy", spec.router.policy,
        "--service-discovery",
        "--selector", *selector,
        "--service-discovery-port", str(SERVER_PORT),
        "--service-discovery-namespace", spec.namespace,
        "--prometheus-port", str(METRICS_PORT),
        # routing reads request text: no tokenizer, none downloaded
        "--disable-tokenizer-autoload",
    ]  # fmt: skip
    if spec.api_key_secret:
        # NOTE: expanded by the kubelet from the Secret-backed env: the pod spec holds no key
        args += ["--api-key", "$(RADIXSERVE_API_KEY)"]
    return args


def _container(spec: ServiceSpec) -> dict[str, Any]:
    env = [secret_env(API_KEY_ENV, spec.api_key_secret)] if spec.api_key_secret else []
    probe = {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5}
    return {
        "name": "router",
        "image": spec.router.image or DEFAULT_ROUTER_IMAGE,
        "imagePullPolicy": spec.image_pull_policy,
        "args": router_args(spec),
        "env": env,
        "ports": [
            {"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": spec.router.resources or DEFAULT_ROUTER_RESOURCES,
        "livenessProbe": probe,
        # ready once it knows a worker: a router with none would answer 503 to every request
        "readinessProbe": {**probe, "httpGet": {"path": "/readiness", "port": "http"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def build_router_deployment(spec: ServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": router_selector(spec)},
            "template": {
                "metadata": {"labels": router_labels(spec)},
                "spec": {
                    "serviceAccountName": router_name(spec.name),
                    "automountServiceAccountToken": True,  # the gateway watches pods
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [_container(spec)],
                },
            },
        },
    }


def build_router_service(spec: ServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec),
        "spec": {
            "type": spec.service_type,
            "selector": router_selector(spec),
            "ports": [{"name": "http", "port": spec.service_port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_router_rbac(spec: ServiceSpec) -> list[dict[str, Any]]:
    """A ServiceAccount whose Role lists and watches the namespace's pods, nothing else: the
    gateway's discovery reads pods' labels, IPs and Ready condition."""
    name, rbac = router_name(spec.name), "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec)},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": _meta(spec),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": _meta(spec),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": spec.namespace}],
        },
    ]


def build_router(spec: ServiceSpec) -> list[dict[str, Any]]:
    """Every object of the router, RBAC first (the Deployment's pods need their account)."""
    assert spec.router.enabled
    return [*build_router_rbac(spec), build_router_deployment(spec), build_router_service(spec)]
