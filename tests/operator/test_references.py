"""The allow-lists: a resource's pods name the namespace's default ServiceAccount, the Secrets of
its own fields, and whatever the operator's settings allow; every other ServiceAccount or Secret
reference is refused with its field, before anything is created."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from radixserve_operator import handlers
from radixserve_operator.reconcile import plan
from radixserve_operator.references import ReferenceNotAllowed
from radixserve_operator.settings import OperatorSettings

NONE_ALLOWED = OperatorSettings()


def _secret_env(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}


def _pod(make_body, fetch, spec: dict[str, Any], settings=NONE_ALLOWED) -> dict[str, Any]:
    _, _, objects, _ = plan(make_body({"gpu": {"enabled": False}, **spec}), fetch, settings)
    return objects[0]["spec"]["template"]["spec"]


# name -> (spec naming Secret "db" one way, the path reported)
SECRET_REFERENCES: dict[str, tuple[dict[str, Any], str]] = {
    "spec.env": (
        {"env": [_secret_env("DB", "db")]},
        "spec.containers[0].env[4].valueFrom.secretKeyRef.name",
    ),
    "template env": (
        {"template": {"spec": {"container": {"env": [_secret_env("DB", "db")]}}}},
        "spec.containers[0].env[4].valueFrom.secretKeyRef.name",
    ),
    "secret volume": (
        {"template": {"spec": {"volumes": [{"name": "s", "secret": {"secretName": "db"}}]}}},
        "spec.volumes[3].secret.secretName",
    ),
    "projected volume": (
        {
            "template": {
                "spec": {
                    "volumes": [
                        {
                            "name": "p",
                            "projected": {
                                "sources": [
                                    {"configMap": {"name": "cm"}},
                                    {"secret": {"name": "db"}},
                                ]
                            },
                        }
                    ]
                }
            }
        },
        "spec.volumes[3].projected.sources[1].secret.name",
    ),
    "csi volume": (
        {
            "template": {
                "spec": {
                    "volumes": [
                        {
                            "name": "c",
                            "csi": {"driver": "d", "nodePublishSecretRef": {"name": "db"}},
                        }
                    ]
                }
            }
        },
        "spec.volumes[3].csi.nodePublishSecretRef.name",
    ),
}


@pytest.mark.parametrize("way", SECRET_REFERENCES)
def test_a_secret_outside_the_allow_list_is_refused_with_its_field(
    make_body, fetch, way: str
) -> None:
    spec, path = SECRET_REFERENCES[way]
    with pytest.raises(ReferenceNotAllowed) as e:
        _pod(make_body, fetch, spec)
    assert str(e.value).startswith(f"{path}: Secret 'db' ")
    assert "security.allowedSecrets" in str(e.value)
    # allowed by name, or by "*"
    for allowed in (("other", "db"), ("*",)):
        _pod(make_body, fetch, spec, OperatorSettings(allowed_secrets=allowed))


def test_the_resources_own_secrets_need_no_allow_list(make_body, fetch) -> None:
    spec = {
        "model": {"source": "Qwen/Qwen3-0.6B", "hfTokenSecret": {"name": "hf"}},
        "apiKeySecretRef": {"name": "key"},
        "env": [_secret_env("KEY_AGAIN", "key")],  # the same Secret its own field names
    }
    pod = _pod(make_body, fetch, spec)
    init_env = {e["name"]: e for e in pod["initContainers"][0]["env"]}
    assert init_env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    with pytest.raises(ReferenceNotAllowed, match="Secret 'other'"):
        _pod(make_body, fetch, {**spec, "env": [_secret_env("X", "other")]})


def test_service_accounts(make_body, fetch) -> None:
    def with_account(name: str) -> dict[str, Any]:
        return {"template": {"spec": {"serviceAccountName": name}}}

    assert _pod(make_body, fetch, with_account("default"))["serviceAccountName"] == "default"
    with pytest.raises(ReferenceNotAllowed) as e:
        _pod(make_body, fetch, with_account("admin"))
    assert str(e.value).startswith("spec.serviceAccountName: ServiceAccount 'admin' ")
    assert "security.allowedServiceAccounts" in str(e.value)
    for allowed in (("llm", "admin"), ("*",)):
        pod = _pod(
            make_body,
            fetch,
            with_account("admin"),
            OperatorSettings(allowed_service_accounts=allowed),
        )
        assert pod["serviceAccountName"] == "admin"
    # a Secret allow-list allows no ServiceAccount, and the reverse
    with pytest.raises(ReferenceNotAllowed):
        _pod(make_body, fetch, with_account("admin"), OperatorSettings(allowed_secrets=("admin",)))


def test_image_pull_secrets_are_not_secret_reads(make_body, fetch) -> None:
    """The kubelet uses them to pull; no container of the pod can read them."""
    pod = _pod(
        make_body, fetch, {"template": {"spec": {"imagePullSecrets": [{"name": "regcred"}]}}}
    )
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_refusal_is_a_condition_and_an_event_and_nothing_is_created(
    cluster, memo, make_body
) -> None:
    spec = {"gpu": {"enabled": False}, "env": [_secret_env("DB", "db")]}
    with pytest.raises(kopf.PermanentError):
        handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert cluster.applied == []
    (ready,) = [c for c in cluster.resource()["status"]["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ReferenceNotAllowed")
    assert "spec.containers[0].env[4].valueFrom.secretKeyRef.name" in ready["message"]
    assert [(t, r) for t, r, _ in cluster.events] == [("Warning", "ReferenceNotAllowed")]


def test_only_the_servers_pod_answers_to_the_allow_lists(make_body, fetch) -> None:
    """Another workload the operator builds for the resource (its router, with a ServiceAccount of
    its own) is the operator's, not the resource's ask; its pod still meets the Pod Security level."""
    import copy

    from radixserve_operator.podsecurity import PodSecurityError
    from radixserve_operator.reconcile import check_policy
    from radixserve_operator.spec import parse_spec

    body = make_body({"gpu": {"enabled": False}})
    _, _, objects, _ = plan(body, fetch, NONE_ALLOWED)
    other = copy.deepcopy(objects[0])
    other["metadata"]["name"] = "llm-router"
    other["spec"]["template"]["spec"]["serviceAccountName"] = "llm-router"
    spec = parse_spec(body)
    check_policy(spec, [*objects, other], NONE_ALLOWED)  # no ReferenceNotAllowed
    server = copy.deepcopy(objects[0])
    server["spec"]["template"]["spec"]["serviceAccountName"] = "llm-router"
    with pytest.raises(ReferenceNotAllowed):
        check_policy(spec, [server], NONE_ALLOWED)
    other["spec"]["template"]["spec"]["hostNetwork"] = True
    with pytest.raises(PodSecurityError, match="spec.hostNetwork"):
        check_policy(spec, [*objects, other], NONE_ALLOWED)
