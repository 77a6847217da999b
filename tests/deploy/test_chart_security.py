"""The chart's least-privilege parts: the ValidatingAdmissionPolicy and its binding render as valid
Kubernetes (in the chart and in manifests/), and, evaluated as the API server would (CEL through
cel-python), refuse exactly what the operator refuses, for the operator settings the same chart
values give it (read from the rendered Deployment's env)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from radixserve_operator.podsecurity import violations
from radixserve_operator.reconcile import plan
from radixserve_operator.settings import OperatorSettings
from radixserve_operator.spec import SpecError
from tests.deploy.admission import admit
from tests.deploy.support import K8S_VERSION, REPO, VALUE_SETS, of_kind, one

POLICY, BINDING = "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"
# Every volume source of a PodSpec.
VOLUME_TYPES = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi",
    "downwardAPI", "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk",
    "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim",
    "photonPersistentDisk", "portworxVolume", "projected", "quobyte", "rbd", "scaleIO", "secret",
    "storageos", "vsphereVolume",
)  # fmt: skip


def _security(level: str = "baseline", accounts=(), secrets=(), registries=()) -> dict[str, Any]:
    return {
        "security": {
            "podSecurityLevel": level,
            "allowedServiceAccounts": list(accounts),
            "allowedSecrets": list(secrets),
            "allowedRegistries": list(registries),
            "admissionPolicy": {"enabled": True},
        }
    }


REGISTRY = _security(registries=["registry.example.com/ml"])
KEY_FROM_ANNOTATION = {
    "name": "RADIXSERVE_API_KEY",
    "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['no-such']"}},
}


def _settings(objects: list[dict], monkeypatch: pytest.MonkeyPatch) -> OperatorSettings:
    """The operator's settings, from the env the chart gives its Deployment."""
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    for e in container["env"]:
        if e["name"].startswith("RADIXSERVE_") and "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
    return OperatorSettings.from_env()


def _rsvc(spec: dict[str, Any]) -> dict[str, Any]:
    """A CPU InferenceService (no model config to read)."""
    return {
        "apiVersion": "radixserve.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llm", "namespace": "serving", "uid": "uid-llm", "generation": 1},
        "spec": {"gpu": {"enabled": False}, **spec},
    }


def _no_hub(repo_id: str, revision: str | None = None) -> dict[str, Any]:
    raise AssertionError("a CPU replica reads no model config")


def _operator_refuses(obj: dict[str, Any], settings: OperatorSettings) -> str | None:
    try:
        plan(obj, _no_hub, settings)
    except SpecError as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", [*VALUE_SETS, "restricted"])
def test_policy_and_binding_render_valid(render, name: str) -> None:
    values = _security("restricted") if name == "restricted" else VALUE_SETS[name]
    objects = render(values)
    policy, binding = one(objects, POLICY), one(objects, BINDING)
    for obj in (policy, binding):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert "namespace" not in obj["metadata"]  # cluster-scoped
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["radixserve.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["inferenceservices"],
        }
    ]


def test_policy_can_be_turned_off(render) -> None:
    values = _security()
    values["security"]["admissionPolicy"]["enabled"] = False
    objects = render(values)
    assert not of_kind(objects, POLICY) and not of_kind(objects, BINDING)


def test_namespaced_operator_binds_its_watched_namespaces_only(render) -> None:
    binding = one(render(VALUE_SETS["namespaced-strict"]), BINDING)
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]
    assert "matchResources" not in one(render(), BINDING)["spec"]  # cluster scope: everywhere


def test_plain_manifests_install_the_policy() -> None:
    objects = [o for o in yaml.safe_load_all((REPO / "manifests/operator.yaml").read_text()) if o]
    policy, binding = one(objects, POLICY), one(objects, BINDING)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    hostpath = _rsvc(
        {"template": {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}}
    )
    assert admit(policy, hostpath)


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_volume_types_match_the_operators_pod_security_check(render, level: str) -> None:
    policy = one(render(_security(level, secrets=["*"])), POLICY)
    verdicts = {}
    for kind in VOLUME_TYPES:
        volume = {"name": "v", kind: {}}
        denied = bool(admit(policy, _rsvc({"template": {"spec": {"volumes": [volume]}}})))
        assert denied == bool(violations({"spec": {"volumes": [volume]}}, level)), (level, kind)
        verdicts[kind] = denied
    assert verdicts["hostPath"] and not verdicts["emptyDir"]
    assert verdicts["nfs"] == (level == "restricted")


def _volume(name: str, source: dict[str, Any]) -> dict[str, Any]:
    return {"template": {"spec": {"volumes": [{"name": name, **source}]}}}


def _secret_env(secret: str) -> dict[str, Any]:
    return {"name": "DB", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}


# name -> (chart values, spec, a fragment the policy's denial names; None: admitted)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str | None]] = {
    "plain": (_security(), {}, None),
    "hostPath": (_security(), _volume("host", {"hostPath": {"path": "/"}}), "volume host"),
    "nfs at baseline": (_security(), _volume("n", {"nfs": {"server": "s", "path": "/"}}), None),
    "nfs at restricted": (
        _security("restricted"),
        _volume("n", {"nfs": {"server": "s", "path": "/"}}),
        "Pod Security Standard restricted",
    ),
    "csi at restricted": (_security("restricted"), _volume("c", {"csi": {"driver": "d"}}), None),
    "account not allowed": (
        _security(),
        {"template": {"spec": {"serviceAccountName": "admin"}}},
        "ServiceAccount admin",
    ),
    "default account": (
        _security(),
        {"template": {"spec": {"serviceAccountName": "default"}}},
        None,
    ),
    "account allowed": (
        _security(accounts=["admin"]),
        {"template": {"spec": {"serviceAccountName": "admin"}}},
        None,
    ),
    "any account": (
        _security(accounts=["*"]),
        {"template": {"spec": {"serviceAccountName": "admin"}}},
        None,
    ),
    "env secret": (_security(), {"env": [_secret_env("db")]}, "DB reads a Secret"),
    "template env secret": (
        _security(),
        {"template": {"spec": {"container": {"env": [_secret_env("db")]}}}},
        "DB reads a Secret",
    ),
    "env secret allowed": (_security(secrets=["db"]), {"env": [_secret_env("db")]}, None),
    "own secret in env": (
        _security(),
        {"apiKeySecretRef": {"name": "db"}, "env": [_secret_env("db")]},
        None,
    ),
    "hub token secret in env": (
        _security(),
        {
            "model": {"source": "/models/x", "hfTokenSecret": {"name": "db"}},
            "env": [_secret_env("db")],
        },
        None,
    ),
    "secret volume": (_security(), _volume("s", {"secret": {"secretName": "db"}}), "volume s"),
    "secret volume allowed": (
        _security(secrets=["db"]),
        _volume("s", {"secret": {"secretName": "db"}}),
        None,
    ),
    "projected secret": (
        _security(),
        _volume("p", {"projected": {"sources": [{"secret": {"name": "db"}}]}}),
        "volume p",
    ),
    "csi secret": (
        _security(),
        _volume("c", {"csi": {"driver": "d", "nodePublishSecretRef": {"name": "db"}}}),
        "volume c",
    ),
    "api key flag": (_security(), {"runtime": {"extraArgs": ["--api-key=s3cret"]}}, "--api-key"),
    "api key prefix": (_security(), {"runtime": {"extraArgs": ["--api", "s3cret"]}}, "--api-key"),
    "other flags": (_security(), {"runtime": {"extraArgs": ["--attn", "torch"]}}, None),
    "open load balancer": (_security(), {"service": {"type": "LoadBalancer"}}, "spec.service.type"),
    "open node port on purpose": (
        _security(),
        {"service": {"type": "NodePort", "allowUnauthenticated": True}},
        None,
    ),
    "load balancer with a key": (
        _security(),
        {"service": {"type": "LoadBalancer"}, "apiKeySecretRef": {"name": "k"}},
        None,
    ),
    "null emptyDir beside a hostPath": (
        _security(),
        _volume("h", {"emptyDir": None, "hostPath": {"path": "/"}}),
        "volume h",
    ),
    "two volume sources": (
        _security(),
        _volume("t", {"emptyDir": {}, "configMap": {"name": "c"}}),
        "volume t must have exactly one source",
    ),
    "api key env from a missing annotation": (
        _security(),
        {"service": {"type": "LoadBalancer"}, "apiKeySecretRef": {"name": "k"},
         "env": [KEY_FROM_ANNOTATION]},
        "RADIXSERVE_API_KEY is set by the operator",
    ),
    "api key env in the template": (
        _security(),
        {"template": {"spec": {"container": {"env": [KEY_FROM_ANNOTATION]}}}},
        "RADIXSERVE_API_KEY is set by the operator",
    ),
    "image under an allowed registry": (REGISTRY, {"image": "registry.example.com/ml/rs:1"}, None),
    "image elsewhere": (REGISTRY, {"image": "docker.io/evil/rs:1"}, "docker.io/evil/rs:1"),
    "image past the prefix's boundary": (
        REGISTRY, {"image": "registry.example.com/ml-evil/rs:1"}, "is not under",
    ),
    "router image elsewhere": (
        REGISTRY, {"router": {"enabled": True, "image": "docker.io/evil/router:1"}},
        "docker.io/evil/router:1",
    ),
    "default images with an allow-list": (REGISTRY, {}, None),
    "any image without an allow-list": (_security(), {"image": "docker.io/evil/rs:1"}, None),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_policy_refuses_what_the_operator_refuses(render, monkeypatch, case: str) -> None:
    values, spec, fragment = CASES[case]
    objects = render(values)
    obj = _rsvc(spec)
    denials = admit(one(objects, POLICY), obj)
    refused = _operator_refuses(obj, _settings(objects, monkeypatch))
    if fragment is None:
        assert denials == [] and refused is None, (denials, refused)
    else:
        assert denials and any(fragment in d for d in denials), denials
        assert refused is not None, "the operator would create it"


def test_a_spec_left_as_it_was_is_not_judged_again(render) -> None:
    """The operator's own writes (kopf's annotations) to a resource admitted before the policy
    existed are not refused; a change to its spec is."""
    policy = one(render(), POLICY)
    old = _rsvc(_volume("host", {"hostPath": {"path": "/"}}))
    annotated = {**old, "metadata": {**old["metadata"], "annotations": {"radixserve.dev/x": "1"}}}
    assert admit(policy, annotated, old, operation="UPDATE") is None
    changed = {**annotated, "spec": {**annotated["spec"], "replicas": 2}}
    assert admit(policy, changed, old, operation="UPDATE")


def test_chart_values_reach_the_operator(render, monkeypatch) -> None:
    values = {
        **_security("restricted", accounts=["llm"], secrets=["ca", "db"],
                    registries=["registry.example.com/ml", "ghcr.io/radixserve/"]),
        "networkPolicy": {"enabled": False, "monitoringNamespace": "observability"},
    }
    settings = _settings(render(values), monkeypatch)
    assert settings.pod_security_level == "restricted"
    assert settings.allowed_service_accounts == ("llm",)
    assert settings.allowed_secrets == ("ca", "db")
    assert settings.allowed_registries == ("registry.example.com/ml", "ghcr.io/radixserve/")
    assert settings.network_policy is False and settings.monitoring_namespace == "observability"
    for name in ("RADIXSERVE_NETWORK_POLICY", "RADIXSERVE_MONITORING_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    defaults = _settings(render(), monkeypatch)
    assert defaults == OperatorSettings(
        image=defaults.image, cpu_image=defaults.cpu_image, prometheus_url=defaults.prometheus_url
    )  # baseline, nothing allowed, NetworkPolicies on, monitoring namespace "monitoring"


BAD = {
    "unknown level": {"security": {"podSecurityLevel": "privileged"}},
    "secret name with capitals": {"security": {"allowedSecrets": ["My_Secret"]}},
    "account list as a string": {"security": {"allowedServiceAccounts": "llm"}},
    "monitoring namespace not a label": {"networkPolicy": {"monitoringNamespace": "Mon"}},
    "network policy flag as a string": {"networkPolicy": {"enabled": "no"}},
}


@pytest.mark.parametrize("case", BAD)
def test_schema_rejects_bad_security_values(case: str) -> None:
    import helm_python as helm

    from tests.deploy.support import CHART_DIR

    with helm.Chart.load(CHART_DIR) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(chart.merge_values(BAD[case]))
