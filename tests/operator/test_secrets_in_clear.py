"""Credentials stay out of reach: an exposed Service needs an API key (or says loudly that it has
none), the API key is never in the pod spec in clear (`--api-key` in extraArgs, or a literal
RADIXSERVE_API_KEY), and the hub token goes only to the download init container."""

from __future__ import annotations

import argparse
from typing import Any

import kopf
import pytest

from radixserve_operator import handlers
from radixserve_operator.reconcile import plan
from radixserve_operator.spec import SpecError, parse_spec

CPU = {"gpu": {"enabled": False}}


def _spec(make_body, spec: dict[str, Any]):
    return parse_spec(make_body({**CPU, **spec}))


@pytest.mark.parametrize("type_", ["NodePort", "LoadBalancer"])
def test_exposed_service_without_a_key_is_refused(make_body, type_: str) -> None:
    with pytest.raises(SpecError, match=f"spec.service.type {type_} .*spec.apiKeySecretRef"):
        _spec(make_body, {"service": {"type": type_}})
    assert _spec(make_body, {"service": {"type": type_}, "apiKeySecretRef": {"name": "k"}}).exposed
    opened = _spec(make_body, {"service": {"type": type_, "allowUnauthenticated": True}})
    assert opened.exposed and opened.allow_unauthenticated
    assert not _spec(make_body, {}).exposed  # ClusterIP needs no key


def test_open_exposed_service_gets_a_warning_event(cluster, memo, make_body) -> None:
    spec = {**CPU, "service": {"type": "LoadBalancer", "allowUnauthenticated": True}}
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert cluster.objects[("Service", "serving", "llm")]["spec"]["type"] == "LoadBalancer"
    warnings = [(r, m) for t, r, m in cluster.events if t == "Warning"]
    assert [r for r, _ in warnings] == ["UnauthenticatedService"]
    assert "LoadBalancer without an API key" in warnings[0][1]


def test_exposed_service_without_a_key_is_blocked_in_status(cluster, memo, make_body) -> None:
    with pytest.raises(kopf.PermanentError):
        handlers.on_create(
            body=cluster.create(make_body({**CPU, "service": {"type": "NodePort"}})),
            memo=memo,
            logger=None,
        )
    assert cluster.applied == []
    (ready,) = [c for c in cluster.resource()["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "InvalidSpec" and "spec.service.type NodePort" in ready["message"]
    assert [(t, r) for t, r, _ in cluster.events] == [("Warning", "InvalidSpec")]


KEY_FLAGS = ["--api-key", "--api-key=s3cret", "--api-k", "--api=s3cret", "--ap"]


@pytest.mark.parametrize("flag", KEY_FLAGS)
def test_api_key_in_extra_args_is_refused(make_body, flag: str) -> None:
    # the runtime's own parser would take each of these as the key (argparse expands prefixes)
    from radixserve.cli import serve as serve_cli

    parser = argparse.ArgumentParser(prog="radixserve")
    serve_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = [flag] if "=" in flag else [flag, "s3cret"]
    assert parser.parse_args(["serve", *args]).api_key == "s3cret"

    extra = ["--metrics-without-key", *args]
    with pytest.raises(SpecError, match=r"spec.runtime.extraArgs\[1\]: .*spec.apiKeySecretRef"):
        _spec(make_body, {"runtime": {"extraArgs": extra}})


def test_other_extra_args_pass(make_body) -> None:
    extra = ["--metrics-without-key", "--attn", "torch", "--api-keys-are-elsewhere"]
    assert _spec(make_body, {"runtime": {"extraArgs": extra}}).runtime.extra_args == tuple(extra)


@pytest.mark.parametrize("where", ["env", "template"])
def test_literal_api_key_env_is_refused(make_body, where: str) -> None:
    env = [{"name": "RADIXSERVE_API_KEY", "value": "s3cret"}]
    spec = {"env": env} if where == "env" else {"template": {"spec": {"container": {"env": env}}}}
    with pytest.raises(SpecError, match=r"RADIXSERVE_API_KEY as a literal value"):
        _spec(make_body, spec)


# Each would replace the Secret's key with an empty value, which the server takes for no key.
KEY_SOURCES = {
    "missing-annotation": {"fieldRef": {"fieldPath": "metadata.annotations['no-such']"}},
    "optional-configmap": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": True}},
    "other-secret": {"secretKeyRef": {"name": "llm-key", "key": "empty", "optional": True}},
}


@pytest.mark.parametrize("where", ["env", "template"])
@pytest.mark.parametrize("source", KEY_SOURCES, ids=str)
def test_no_env_entry_may_set_the_api_key(make_body, where: str, source: str) -> None:
    env = [{"name": "RADIXSERVE_API_KEY", "valueFrom": KEY_SOURCES[source]}]
    spec = {
        "service": {"type": "LoadBalancer"},
        "apiKeySecretRef": {"name": "llm-key"},
        **({"env": env} if where == "env" else {"template": {"spec": {"container": {"env": env}}}}),
    }
    with pytest.raises(SpecError, match=r"RADIXSERVE_API_KEY is set by the operator from "
                                        r"spec.apiKeySecretRef only"):
        _spec(make_body, spec)


def test_the_api_key_comes_from_its_secret_whatever_the_env(make_body, fetch, validate_k8s) -> None:
    """The builders' own guard, beneath the parser's: a user entry of that name cannot replace
    the Secret's, and the Secret key is required (a missing one keeps the pod from starting)."""
    import dataclasses

    from radixserve_operator.builders import build_deployment

    spec = _spec(make_body, {"service": {"type": "LoadBalancer"}, "apiKeySecretRef": {"name": "k"}})
    smuggled = {"name": "RADIXSERVE_API_KEY", "valueFrom": KEY_SOURCES["missing-annotation"]}
    deployment = build_deployment(dataclasses.replace(spec, env=(smuggled,)), 1, 1)
    validate_k8s(deployment)
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "RADIXSERVE_API_KEY"] == [
        {"name": "RADIXSERVE_API_KEY",
         "valueFrom": {"secretKeyRef": {"name": "k", "key": "api-key", "optional": False}}}
    ]


def test_hub_token_only_in_the_download_init_container(make_body, fetch) -> None:
    body = make_body({"model": {"source": "Qwen/Qwen3-0.6B", "hfTokenSecret": {"name": "hf"}}})
    _, _, objects, _ = plan(body, fetch)
    pod = objects[0]["spec"]["template"]["spec"]
    (init,), (server,) = pod["initContainers"], pod["containers"]
    assert "HF_TOKEN" in {e["name"] for e in init["env"]}
    assert "HF_TOKEN" not in {e["name"] for e in server["env"]}
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server["env"]
