"""The NetworkPolicy of an InferenceService's pods: the server port is open to the resource's own
router, to the peers the spec names (default: the pods of its namespace) and to the monitoring
namespace; to anyone when the Service is exposed on purpose (NodePort, LoadBalancer: the API key
guards it). Egress stays open (model downloads) unless the spec restricts it; DNS is then always
allowed. Pure: no cluster access; owner references are added by the handlers."""

from __future__ import annotations

from typing import Any

from radixserve_operator import (
    COMPONENT_ROUTER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_RS_COMPONENT,
    SERVER_PORT,
)
from radixserve_operator.builders import object_meta, selector_labels
from radixserve_operator.settings import OperatorSettings
from radixserve_operator.spec import ServiceSpec

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
SAME_NAMESPACE = {"podSelector": {}}


def router_peer(spec: ServiceSpec) -> dict[str, Any]:
    """The pods of this resource's router (same namespace)."""
    return {
        "podSelector": {
            "matchLabels": {LABEL_RS_COMPONENT: COMPONENT_ROUTER, LABEL_INSTANCE: spec.name}
        }
    }


def ingress_peers(spec: ServiceSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    peers = [router_peer(spec)]
    given = spec.network.ingress_from
    peers += [SAME_NAMESPACE] if given is None else [dict(p) for p in given]
    if settings.monitoring_namespace:
        peers.append(
            {
                "namespaceSelector": {
                    "matchLabels": {NAMESPACE_NAME_LABEL: settings.monitoring_namespace}
                }
            }
        )
    return peers


def build_network_policy(spec: ServiceSpec, settings: OperatorSettings) -> dict[str, Any]:
    port = [{"protocol": "TCP", "port": SERVER_PORT}]
    # NOTE: an exposed Service's clients come from outside the cluster (or from a node, after
    # SNAT): no peer list names them, so the port is open to all and the API key is the guard.
    rule: dict[str, Any] = {"ports": port}
    if not spec.exposed:
        rule["from"] = ingress_peers(spec, settings)
    policy: dict[str, Any] = {
        # the server's pods only (its labels(), not the router's pods of the same instance)
        "podSelector": {"matchLabels": {**selector_labels(spec.name), LABEL_COMPONENT: "inference"}},
        "policyTypes": ["Ingress"],
        "ingress": [rule],
    }
    if spec.network.egress is not None:
        policy["policyTypes"].append("Egress")
        policy["egress"] = [*(dict(r) for r in spec.network.egress), {"ports": DNS_PORTS}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(spec),
        "spec": policy,
    }
