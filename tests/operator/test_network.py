"""The NetworkPolicy of an InferenceService's pods: the server port open to its router, the peers
its spec names (default: its namespace) and the monitoring namespace, to anyone only for an
exposed Service; egress open unless the spec restricts it; none (and the old one deleted) when the
operator's settings turn NetworkPolicies off."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve_operator import handlers
from radixserve_operator.reconcile import plan
from radixserve_operator.settings import OperatorSettings

CPU = {"gpu": {"enabled": False}}
ROUTER = {
    "podSelector": {
        "matchLabels": {"radixserve.dev/component": "router", "app.kubernetes.io/instance": "llm"}
    }
}
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
PORT = [{"protocol": "TCP", "port": 8000}]


def _objects(make_body, fetch, spec: dict[str, Any], settings=None) -> dict[str, dict[str, Any]]:
    _, _, objects, _ = plan(make_body({**CPU, **spec}), fetch, settings or OperatorSettings())
    return {o["kind"]: o for o in objects}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_default_policy(make_body, fetch, validate_k8s) -> None:
    objects = _objects(make_body, fetch, {})
    policy = objects["NetworkPolicy"]
    validate_k8s(policy)
    assert policy["metadata"]["name"] == "llm" and policy["metadata"]["namespace"] == "serving"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-llm"
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec  # egress open
    assert spec["ingress"] == [{"ports": PORT, "from": [ROUTER, {"podSelector": {}}, MONITORING]}]
    # it selects the server's pods, not the router's pods of the same instance
    server = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    router = {**ROUTER["podSelector"]["matchLabels"], "app.kubernetes.io/name": "radixserve"}
    assert _selects(spec["podSelector"], server) and not _selects(spec["podSelector"], router)


def test_peers_the_spec_names_replace_the_namespace(make_body, fetch, validate_k8s) -> None:
    apps = {"namespaceSelector": {"matchLabels": {"team": "apps"}}, "podSelector": {}}
    policy = _objects(make_body, fetch, {"networkPolicy": {"ingressFrom": [apps]}})["NetworkPolicy"]
    validate_k8s(policy)
    assert policy["spec"]["ingress"][0]["from"] == [ROUTER, apps, MONITORING]
    closed = _objects(make_body, fetch, {"networkPolicy": {"ingressFrom": []}})["NetworkPolicy"]
    assert closed["spec"]["ingress"][0]["from"] == [ROUTER, MONITORING]


def test_monitoring_namespace_is_a_setting(make_body, fetch) -> None:
    obs = OperatorSettings(monitoring_namespace="observability")
    peers = _objects(make_body, fetch, {}, obs)["NetworkPolicy"]["spec"]["ingress"][0]["from"]
    assert peers[-1] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}
    }
    none = OperatorSettings(monitoring_namespace="")
    peers = _objects(make_body, fetch, {}, none)["NetworkPolicy"]["spec"]["ingress"][0]["from"]
    assert peers == [ROUTER, {"podSelector": {}}]


@pytest.mark.parametrize("type_", ["NodePort", "LoadBalancer"])
def test_an_exposed_service_is_open_to_all_on_the_port(make_body, fetch, type_: str) -> None:
    spec = {"service": {"type": type_}, "apiKeySecretRef": {"name": "key"}}
    policy = _objects(make_body, fetch, spec)["NetworkPolicy"]
    assert policy["spec"]["ingress"] == [{"ports": PORT}]


def test_egress_restricted_when_the_spec_says(make_body, fetch, validate_k8s) -> None:
    mirror = {
        "to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }
    policy = _objects(make_body, fetch, {"networkPolicy": {"egress": [mirror]}})["NetworkPolicy"]
    validate_k8s(policy)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    dns = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    assert policy["spec"]["egress"] == [mirror, dns]


def test_turned_off_none_is_built_and_ours_is_deleted(
    cluster, memo, make_body, monkeypatch
) -> None:
    handlers.on_create(body=cluster.create(make_body(CPU)), memo=memo, logger=None)
    assert ("NetworkPolicy", "serving", "llm") in cluster.objects
    monkeypatch.setenv("RADIXSERVE_NETWORK_POLICY", "false")
    handlers.resync(body=cluster.resource(), memo=memo, logger=None)
    assert ("NetworkPolicy", "serving", "llm") not in cluster.objects
    assert ("NetworkPolicy", "serving", "llm") in cluster.deleted
    assert "Deployment" in {o["kind"] for o in cluster.applied}
