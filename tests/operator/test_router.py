"""spec.router: the SGLang model gateway as NAME-router, built from the resource, checked against
the real Kubernetes schema and against the gateway's own argument parser, and reconciled (created,
then removed when the spec turns it off) through the handlers over the fake cluster."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from radixserve_operator import handlers
from radixserve_operator.network import build_network_policy, router_peer
from radixserve_operator.reconcile import _applied, plan
from radixserve_operator.settings import OperatorSettings
from radixserve_operator.spec import SpecError, parse_spec
from radixserve_operator.status import compute_status

CPU = {"gpu": {"enabled": False}, "replicas": 3}
ROUTED = {**CPU, "router": {"enabled": True}}
ROUTER_OBJECTS = {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"}


def _router_objects(make_body, fetch, spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    _, _, objects, _ = plan(make_body(spec), fetch)
    return {o["kind"]: o for o in objects if o["metadata"]["name"] == "llm-router"}


def _server(make_body, fetch, spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    _, _, objects, _ = plan(make_body(spec), fetch)
    return {o["kind"]: o for o in objects if o["metadata"]["name"] == "llm"}


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def _selector_arg(args: list[str]) -> dict[str, str]:
    i = args.index("--selector") + 1
    out = {}
    while i < len(args) and not args[i].startswith("--"):
        k, _, v = args[i].partition("=")
        out[k] = v
        i += 1
    return out


def test_router_objects_exist_only_when_enabled_and_validate(make_body, fetch, validate_k8s) -> None:
    assert _router_objects(make_body, fetch, CPU) == {}
    objs = _router_objects(make_body, fetch, ROUTED)
    assert set(objs) == ROUTER_OBJECTS
    for obj in objs.values():
        validate_k8s(obj)
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == "uid-llm" and ref["controller"] is True
        assert obj["metadata"]["namespace"] == "serving"


def test_router_discovers_only_this_resources_server_pods(make_body, fetch) -> None:
    server = _server(make_body, fetch, ROUTED)
    router = _router_objects(make_body, fetch, ROUTED)
    server_pod = server["Deployment"]["spec"]["template"]["metadata"]["labels"]
    router_pod = router["Deployment"]["spec"]["template"]["metadata"]["labels"]
    args = _container(router["Deployment"])["args"]
    discovery = _selector_arg(args)
    assert _matches(discovery, server_pod) and not _matches(discovery, router_pod)
    assert discovery["app.kubernetes.io/instance"] == "llm"
    assert args[args.index("--service-discovery-namespace") + 1] == "serving"
    assert args[args.index("--service-discovery-port") + 1] == "8000"
    assert args[args.index("--policy") + 1] == "cache_aware"
    # the server's Service never routes to the router, the router's Service only to it
    assert not _matches(server["Service"]["spec"]["selector"], router_pod)
    assert _matches(router["Service"]["spec"]["selector"], router_pod)
    assert not _matches(router["Service"]["spec"]["selector"], server_pod)
    assert router["Deployment"]["spec"]["selector"]["matchLabels"] == router["Service"]["spec"]["selector"]


def test_router_pods_are_the_ones_the_server_network_policy_lets_in(make_body, fetch) -> None:
    router_pod = _router_objects(make_body, fetch, ROUTED)["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert router_pod["radixserve.dev/component"] == "router"
    assert router_pod["app.kubernetes.io/instance"] == "llm"
    spec = parse_spec(make_body(ROUTED))
    policy = build_network_policy(spec, OperatorSettings.from_env())
    assert _matches(router_peer(spec)["podSelector"]["matchLabels"], router_pod)
    assert router_peer(spec) in policy["spec"]["ingress"][0]["from"]
    assert not _matches(policy["spec"]["podSelector"]["matchLabels"], router_pod)  # not the router's port


def test_router_rbac_is_least_privilege(make_body, fetch) -> None:
    objs = _router_objects(make_body, fetch, ROUTED)
    assert objs["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = objs["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "llm-router"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-router", "namespace": "serving"}]
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llm-router"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert _container(objs["Deployment"])["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_router_spec_fields_reach_the_deployment(make_body, fetch) -> None:
    resources = {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}}
    spec = {**CPU, "router": {"enabled": True, "policy": "round_robin", "replicas": 2,
                              "resources": resources, "image": "registry.local/smg:1"}}
    dep = _router_objects(make_body, fetch, spec)["Deployment"]
    c = _container(dep)
    assert dep["spec"]["replicas"] == 2
    assert c["args"][c["args"].index("--policy") + 1] == "round_robin"
    assert c["resources"] == resources and c["image"] == "registry.local/smg:1"
    with pytest.raises(SpecError, match="spec.router.policy"):
        parse_spec(make_body({**CPU, "router": {"enabled": True, "policy": "random"}}))


def test_api_key_reaches_the_router_from_the_secret_only(make_body, fetch) -> None:
    spec = {**ROUTED, "apiKeySecretRef": {"name": "llm-key"}}
    c = _container(_router_objects(make_body, fetch, spec)["Deployment"])
    assert c["env"] == [{"name": "RADIXSERVE_API_KEY",
                         "valueFrom": {"secretKeyRef": {"name": "llm-key", "key": "api-key", "optional": False}}}]
    assert c["args"][c["args"].index("--api-key") + 1] == "$(RADIXSERVE_API_KEY)"  # the kubelet expands it
    assert "--api-key" not in _container(_router_objects(make_body, fetch, ROUTED)["Deployment"])["args"]


@pytest.mark.skipif(importlib.util.find_spec("smg") is None, reason="the SGLang model gateway `smg` is not installed")
def test_router_args_parse_with_the_gateways_own_parser(make_body, fetch) -> None:
    from smg.launch_router import parse_router_args

    spec = {**ROUTED, "apiKeySecretRef": {"name": "llm-key"}, "router": {"enabled": True, "policy": "power_of_two"}}
    args = _container(_router_objects(make_body, fetch, spec)["Deployment"])["args"]
    assert args[0] == "launch"
    parsed = parse_router_args(args[1:])
    assert parsed.policy == "power_of_two" and parsed.service_discovery is True
    assert parsed.selector == {"app.kubernetes.io/instance": "llm", "app.kubernetes.io/name": "radixserve"}
    assert parsed.service_discovery_namespace == "serving" and parsed.service_discovery_port == 8000
    assert parsed.port == 8000 and parsed.api_key == "$(RADIXSERVE_API_KEY)"


def test_status_endpoint_names_the_router_when_it_is_on(make_body) -> None:
    assert compute_status(make_body(ROUTED), None, [])["endpoint"] == "http://llm-router.serving.svc:8000/v1"
    assert compute_status(make_body(CPU), None, [])["endpoint"] == "http://llm.serving.svc:8000/v1"


def test_turning_the_router_off_deletes_it_and_keeps_the_server(cluster, memo, make_body) -> None:
    handlers.on_create(body=cluster.create(make_body(ROUTED)), memo=memo, logger=None)
    kinds = {kind for kind, _, name in cluster.objects if name == "llm-router"}
    assert kinds == ROUTER_OBJECTS
    # the server's Deployment is remembered under its own name, not the router's
    assert _applied[("Deployment", "serving", "llm")] == cluster.deployment()["metadata"]["generation"]
    assert cluster.resource()["status"]["endpoint"] == "http://llm-router.serving.svc:8000/v1"

    def off(spec: dict[str, Any]) -> None:
        spec["router"]["enabled"] = False

    handlers.on_update(body=cluster.edit_spec(off), memo=memo, logger=None)
    assert not [key for key in cluster.objects if key[2] == "llm-router"]
    assert {(k, n) for k, _, n in cluster.deleted} == {(k, "llm-router") for k in ROUTER_OBJECTS}
    assert ("Deployment", "serving", "llm") in cluster.objects and ("Service", "serving", "llm") in cluster.objects
    assert cluster.resource()["status"]["endpoint"] == "http://llm.serving.svc:8000/v1"
