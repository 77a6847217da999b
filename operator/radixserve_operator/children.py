"""Every object an InferenceService owns: the workload (a Deployment, or a StatefulSet for a PVC
per replica) and the Service (`builders`), the NetworkPolicy of its pods (`network`, unless the
operator's settings turn it off), and the optional children its spec may ask for — a
PodDisruptionBudget, the router (`router`, NAME-router), and an autoscaler (an `autoscaling/v2`
HPA or a KEDA ScaledObject) whose
target is the InferenceService itself. Pure: no cluster access; owner references are added by the
handlers."""

from __future__ import annotations

from typing import Any

from radixserve_operator import API_VERSION, KIND
from radixserve_operator.builders import (
    build_service,
    build_workload,
    object_meta,
    selector_labels,
    workload_kind,
)
from radixserve_operator.network import build_network_policy
from radixserve_operator.router import build_router
from radixserve_operator.settings import OperatorSettings
from radixserve_operator.spec import ServiceSpec


def _target_ref(spec: ServiceSpec) -> dict[str, str]:
    """The InferenceService itself: autoscalers write its scale subresource (spec.replicas), so
    the operator never fights them over the Deployment's replicas."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": spec.name}


def wants_disruption_budget(spec: ServiceSpec) -> bool:
    return spec.disruption_budget.enabled and spec.may_run_replicas > 1


def build_disruption_budget(spec: ServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(spec),
        "spec": {
            "maxUnavailable": spec.disruption_budget.max_unavailable,
            "selector": {"matchLabels": selector_labels(spec.name)},
            # A pod still loading its model (not ready) serves nothing: a drain may take it.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def target_quantity(value: float) -> str:
    """A target as a Kubernetes quantity: 16 -> "16", 0.8 -> "800m"."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def build_hpa(spec: ServiceSpec) -> dict[str, Any]:
    a = spec.autoscaling
    assert a is not None and a.engine == "hpa"
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(spec),
        "spec": {
            "scaleTargetRef": _target_ref(spec),
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": a.metric_name},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": target_quantity(a.target),
                        },
                    },
                }
            ],
        },
    }


def keda_query(spec: ServiceSpec) -> str:
    """PromQL summing the metric over the resource's pods (KEDA divides by the replicas)."""
    a = spec.autoscaling
    assert a is not None
    if a.query:
        return a.query
    # NOTE: Deployment pods are NAME-<replicaset hash>-<pod hash>, StatefulSet pods NAME-<ordinal>;
    # PromQL regexes are anchored.
    pods = "[0-9]+" if workload_kind(spec) == "StatefulSet" else "[a-z0-9]+-[a-z0-9]+"
    sel = f'namespace="{spec.namespace}",pod=~"{spec.name}-{pods}"'
    return {
        "requests": f"sum(radixserve_running{{{sel}}}) + sum(radixserve_waiting{{{sel}}})",
        "kvCache": f"sum(radixserve_kv_cache_usage_ratio{{{sel}}})",
        "tokens": f"sum(rate(radixserve_generation_tokens_total{{{sel}}}[1m]))",
    }[a.metric]


def build_scaled_object(spec: ServiceSpec) -> dict[str, Any]:
    a = spec.autoscaling
    assert a is not None and a.engine == "keda"
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": object_meta(spec),
        "spec": {
            "scaleTargetRef": _target_ref(spec),
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": a.prometheus_url,
                        "query": keda_query(spec),
                        "threshold": f"{a.target:g}",  # KEDA parses a float
                    },
                }
            ],
        },
    }


# The children that exist only when the spec asks for them; the reconciler deletes one of ours
# that the spec no longer asks for (the workload kind the cache mode no longer uses, too).
OPTIONAL_KINDS = (
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("policy/v1", "PodDisruptionBudget"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("networking.k8s.io/v1", "NetworkPolicy"),  # when the operator's settings turn it off
)


def build_all(
    spec: ServiceSpec,
    tp: int,
    generation: int,
    settings: OperatorSettings | None = None,
    in_place: bool = False,
) -> list[dict[str, Any]]:
    """The workload and the Service, then the NetworkPolicy and the optional children the spec
    asks for. `settings`: the operator's (default: from its environment); `in_place`: this
    generation rolls out in place (builders._strategy)."""
    settings = settings or OperatorSettings.from_env()
    out = [build_workload(spec, tp, generation, in_place), build_service(spec)]
    if settings.network_policy:
        out.append(build_network_policy(spec, settings))
    if wants_disruption_budget(spec):
        out.append(build_disruption_budget(spec))
    if spec.autoscaling and spec.autoscaling.engine == "hpa":
        out.append(build_hpa(spec))
    if spec.autoscaling and spec.autoscaling.engine == "keda":
        out.append(build_scaled_object(spec))
    if spec.router.enabled:
        out += build_router(spec)
    return out
