"""The Pod Security Standards check: every rule of `baseline` and `restricted` names the field that
breaks it (each rule is a case: a compliant pod the builders wrote, one field changed); the
builders' pods meet `restricted` for every kind of spec; and an InferenceService whose pod would
break the operator's level gets a condition and an event naming the field, and nothing is applied."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import kopf
import pytest

from radixserve_operator import handlers
from radixserve_operator.podsecurity import PodSecurityError, violations
from radixserve_operator.reconcile import plan
from radixserve_operator.settings import OperatorSettings

RESTRICTED = OperatorSettings(pod_security_level="restricted", allowed_secrets=("ca",))
HUB = {"model": {"source": "Qwen/Qwen3-0.6B", "hfTokenSecret": {"name": "hf"}}}
HOST = {"name": "host", "hostPath": {"path": "/"}}
APPARMOR = "container.apparmor.security.beta.kubernetes.io/server"


def _template(make_body, fetch, spec: dict[str, Any], settings=RESTRICTED) -> dict[str, Any]:
    _, _, objects, _ = plan(make_body(spec), fetch, settings)
    return objects[0]["spec"]["template"]


@pytest.fixture
def pod(make_body, fetch) -> dict[str, Any]:
    """A hub model's pod (init container + server), as the builders write it."""
    return _template(make_body, fetch, HUB)


Change = Callable[[dict[str, Any]], None]


def _ctx(pod: dict[str, Any], field: str = "containers") -> dict[str, Any]:
    return pod["spec"][field][0]["securityContext"]


def _pod_ctx(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["securityContext"]


# name -> (change, the path it must be reported at)
BASELINE_RULES: dict[str, tuple[Change, str]] = {
    "hostPath volume": (lambda p: p["spec"]["volumes"].append(HOST), "spec.volumes[3].hostPath"),
    "hostNetwork": (lambda p: p["spec"].update(hostNetwork=True), "spec.hostNetwork"),
    "hostPID": (lambda p: p["spec"].update(hostPID=True), "spec.hostPID"),
    "hostIPC": (lambda p: p["spec"].update(hostIPC=True), "spec.hostIPC"),
    "privileged": (
        lambda p: _ctx(p).update(privileged=True),
        "spec.containers[0].securityContext.privileged",
    ),
    "privileged init container": (
        lambda p: _ctx(p, "initContainers").update(privileged=True),
        "spec.initContainers[0].securityContext.privileged",
    ),
    "added capability": (
        lambda p: _ctx(p)["capabilities"].update(add=["SYS_ADMIN"]),
        "spec.containers[0].securityContext.capabilities.add",
    ),
    "hostPort": (
        lambda p: p["spec"]["containers"][0]["ports"][0].update(hostPort=8000),
        "spec.containers[0].ports[0].hostPort",
    ),
    "unconfined seccomp": (
        lambda p: _pod_ctx(p).update(seccompProfile={"type": "Unconfined"}),
        "spec.securityContext.seccompProfile.type",
    ),
    "SELinux type": (
        lambda p: _ctx(p).update(seLinuxOptions={"type": "spc_t"}),
        "spec.containers[0].securityContext.seLinuxOptions.type",
    ),
    "SELinux user": (
        lambda p: _pod_ctx(p).update(seLinuxOptions={"user": "system_u"}),
        "spec.securityContext.seLinuxOptions.user",
    ),
    "procMount": (
        lambda p: _ctx(p).update(procMount="Unmasked"),
        "spec.containers[0].securityContext.procMount",
    ),
    "unsafe sysctl": (
        lambda p: _pod_ctx(p).update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        "spec.securityContext.sysctls[0]",
    ),
    "hostProcess": (
        lambda p: _pod_ctx(p).update(windowsOptions={"hostProcess": True}),
        "spec.securityContext.windowsOptions.hostProcess",
    ),
    "AppArmor profile": (
        lambda p: _ctx(p).update(appArmorProfile={"type": "Unconfined"}),
        "spec.containers[0].securityContext.appArmorProfile.type",
    ),
    "AppArmor annotation": (
        lambda p: p["metadata"]["annotations"].update({APPARMOR: "unconfined"}),
        f"metadata.annotations[{APPARMOR}]",
    ),
}
RESTRICTED_RULES: dict[str, tuple[Change, str]] = {
    "nfs volume": (
        lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
        "spec.volumes[3].nfs",
    ),
    "privilege escalation": (
        lambda p: _ctx(p).update(allowPrivilegeEscalation=True),
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
    ),
    "privilege escalation unset": (
        lambda p: _ctx(p, "initContainers").pop("allowPrivilegeEscalation"),
        "spec.initContainers[0].securityContext.allowPrivilegeEscalation",
    ),
    "runAsNonRoot false": (
        lambda p: _ctx(p).update(runAsNonRoot=False),
        "spec.containers[0].securityContext.runAsNonRoot",
    ),
    "runAsNonRoot nowhere": (
        lambda p: (_pod_ctx(p).pop("runAsNonRoot"), _ctx(p).pop("runAsNonRoot")),
        "spec.containers[0].securityContext.runAsNonRoot",
    ),
    "pod runs as root": (
        lambda p: _pod_ctx(p).update(runAsUser=0),
        "spec.securityContext.runAsUser",
    ),
    "container runs as root": (
        lambda p: _ctx(p).update(runAsUser=0),
        "spec.containers[0].securityContext.runAsUser",
    ),
    "no seccomp profile": (  # the init container's own profile covers it
        lambda p: (
            _pod_ctx(p).pop("seccompProfile"),
            _ctx(p, "initContainers").update(seccompProfile={"type": "RuntimeDefault"}),
        ),
        "spec.containers[0].securityContext.seccompProfile.type",
    ),
    "capabilities kept": (
        lambda p: _ctx(p)["capabilities"].update(drop=["NET_RAW"]),
        "spec.containers[0].securityContext.capabilities.drop",
    ),
    "baseline capability added": (
        lambda p: _ctx(p)["capabilities"].update(add=["CHOWN"]),
        "spec.containers[0].securityContext.capabilities.add",
    ),
}


def _paths(template: dict[str, Any], level: str) -> list[str]:
    return [v.path for v in violations(template, level)]


@pytest.mark.parametrize("rule", BASELINE_RULES)
def test_each_baseline_rule_names_its_field(pod: dict[str, Any], rule: str) -> None:
    change, path = BASELINE_RULES[rule]
    broken = copy.deepcopy(pod)
    change(broken)
    assert _paths(broken, "baseline") == [path]
    assert path in _paths(broken, "restricted")  # restricted includes baseline


@pytest.mark.parametrize("rule", RESTRICTED_RULES)
def test_each_restricted_rule_names_its_field(pod: dict[str, Any], rule: str) -> None:
    change, path = RESTRICTED_RULES[rule]
    broken = copy.deepcopy(pod)
    change(broken)
    assert _paths(broken, "restricted") == [path]
    assert _paths(broken, "baseline") == []


def test_restricted_allows_what_it_allows(pod: dict[str, Any]) -> None:
    ok = copy.deepcopy(pod)
    _ctx(ok)["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    ok["metadata"]["annotations"][APPARMOR] = "runtime/default"
    _pod_ctx(ok)["sysctls"] = [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]
    for kind in ("configMap", "csi", "downwardAPI", "ephemeral", "projected", "secret"):
        ok["spec"]["volumes"].append({"name": kind.lower(), kind: {}})
    assert violations(ok, "restricted") == []


BUILT_SPECS: dict[str, dict[str, Any]] = {
    "gpu defaults": {},
    "cpu": {"gpu": {"enabled": False}},
    "hub model with token and key": {**HUB, "apiKeySecretRef": {"name": "key"}},
    "pvc per replica": {
        "model": {"source": "Qwen/Qwen3-0.6B", "cache": {"type": "pvcPerReplica", "size": "50Gi"}}
    },
    "shared read-only claim and pvc source": {
        "model": {
            "source": "pvc://weights/qwen",
            "cache": {"type": "sharedPVC", "claimName": "c", "readOnly": True},
        },
        "parallelism": {"tensor": 2},
    },
    "template volumes": {
        "template": {
            "spec": {
                "volumes": [
                    {"name": "model-cache", "csi": {"driver": "fuse.example"}},
                    {"name": "certs", "secret": {"secretName": "ca"}},
                ],
                "container": {"volumeMounts": [{"name": "certs", "mountPath": "/certs"}]},
            }
        }
    },
}


@pytest.mark.parametrize("name", BUILT_SPECS)
def test_builders_pods_meet_restricted(make_body, fetch, name: str) -> None:
    spec = copy.deepcopy(BUILT_SPECS[name])
    if name == "pvc per replica":
        spec["rollout"] = {"maxSurge": 0}
    template = _template(make_body, fetch, spec)  # plan checks restricted: no error
    assert violations(template, "restricted") == []
    # not vacuous: the same pod with one container's guard off is caught
    _ctx(template)["allowPrivilegeEscalation"] = True
    assert violations(template, "restricted")


def test_plan_refuses_a_template_volume_the_level_forbids(make_body, fetch) -> None:
    nfs = {"template": {"spec": {"volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}}}
    baseline = OperatorSettings()
    assert _template(make_body, fetch, nfs, baseline)["spec"]["volumes"][-1]["name"] == "n"
    with pytest.raises(PodSecurityError, match=r"spec\.volumes\[3\]\.nfs"):
        _template(make_body, fetch, nfs, RESTRICTED)
    host = {"template": {"spec": {"volumes": [HOST]}}}
    with pytest.raises(PodSecurityError, match=r"'baseline'.*spec\.volumes\[3\]\.hostPath"):
        _template(make_body, fetch, host, baseline)


def _ready(cluster) -> dict[str, Any]:
    (c,) = [c for c in cluster.resource()["status"]["conditions"] if c["type"] == "Ready"]
    return c


def test_hostpath_resource_gets_condition_and_event_and_nothing_is_created(
    cluster, memo, make_body
) -> None:
    spec = {"gpu": {"enabled": False}, "template": {"spec": {"volumes": [HOST]}}}
    with pytest.raises(kopf.PermanentError, match="PodSecurityViolation"):  # kopf: no retry
        handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert cluster.applied == []  # no Deployment, Service or anything else
    ready = _ready(cluster)
    assert (ready["status"], ready["reason"]) == ("False", "PodSecurityViolation")
    assert "spec.volumes[3].hostPath" in ready["message"] and "'host'" in ready["message"]
    [(type_, reason, message)] = cluster.events
    assert (type_, reason) == ("Warning", "PodSecurityViolation")
    assert "spec.volumes[3].hostPath" in message

    # the resync keeps the verdict and says nothing new
    handlers.resync(body=cluster.resource(), memo=memo, logger=None)
    assert cluster.applied == [] and len(cluster.events) == 1
    assert _ready(cluster)["reason"] == "PodSecurityViolation"

    # the fix is applied
    fixed = cluster.edit_spec(lambda s: s.pop("template"))
    handlers.on_update(body=fixed, memo=memo, logger=None)
    assert {o["kind"] for o in cluster.applied} >= {"Deployment", "Service"}


def test_apparmor_annotation_from_the_template_is_refused(cluster, memo, make_body) -> None:
    spec = {
        "gpu": {"enabled": False},
        "template": {"metadata": {"annotations": {APPARMOR: "unconfined"}}},
    }
    with pytest.raises(kopf.PermanentError):
        handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert cluster.applied == []
    assert APPARMOR in _ready(cluster)["message"]


def test_level_comes_from_the_operators_environment(cluster, memo, make_body, monkeypatch) -> None:
    nfs = {
        "gpu": {"enabled": False},
        "template": {"spec": {"volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}},
    }
    monkeypatch.setenv("RADIXSERVE_POD_SECURITY_LEVEL", "restricted")
    with pytest.raises(kopf.PermanentError):
        handlers.on_create(body=cluster.create(make_body(nfs)), memo=memo, logger=None)
    assert cluster.applied == [] and _ready(cluster)["reason"] == "PodSecurityViolation"
    monkeypatch.setenv("RADIXSERVE_POD_SECURITY_LEVEL", "baseline")
    handlers.resync(body=cluster.resource(), memo=memo, logger=None)
    assert "Deployment" in {o["kind"] for o in cluster.applied}


def test_settings_parse_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("RADIXSERVE_POD_SECURITY_LEVEL", "restricted")
    monkeypatch.setenv("RADIXSERVE_ALLOWED_SERVICE_ACCOUNTS", "llm, batch,")
    monkeypatch.setenv("RADIXSERVE_ALLOWED_SECRETS", "")
    monkeypatch.setenv("RADIXSERVE_NETWORK_POLICY", "false")
    monkeypatch.setenv("RADIXSERVE_MONITORING_NAMESPACE", "")
    s = OperatorSettings.from_env()
    assert s.pod_security_level == "restricted"
    assert s.allowed_service_accounts == ("llm", "batch") and s.allowed_secrets == ()
    assert s.network_policy is False and s.monitoring_namespace == ""
    monkeypatch.setenv("RADIXSERVE_POD_SECURITY_LEVEL", "privileged")
    with pytest.raises(ValueError, match="baseline, restricted"):
        OperatorSettings.from_env()
    for name in ("RADIXSERVE_POD_SECURITY_LEVEL", "RADIXSERVE_NETWORK_POLICY",
                 "RADIXSERVE_MONITORING_NAMESPACE"):  # fmt: skip
        monkeypatch.delenv(name)
    d = OperatorSettings.from_env()
    assert (d.pod_security_level, d.network_policy, d.monitoring_namespace) == (
        "baseline",
        True,
        "monitoring",
    )


@pytest.mark.parametrize(
    "volume, path",
    [
        ({"name": "h", "emptyDir": None, "hostPath": {"path": "/"}}, "spec.volumes[3].hostPath"),
        ({"name": "h", "hostPath": {"path": "/"}, "emptyDir": {}}, "spec.volumes[3].hostPath"),
        ({"name": "t", "emptyDir": {}, "configMap": {"name": "c"}}, "exactly one source"),
        ({"name": "n", "emptyDir": None}, "its source is null"),
        ({"name": "z"}, "exactly one source, got none"),
    ],
    ids=["null-first", "hostpath-first", "two-sources", "null-only", "no-source"],
)
def test_every_volume_source_key_is_judged(make_body, fetch, volume, path: str) -> None:
    spec = {"gpu": {"enabled": False}, "template": {"spec": {"volumes": [volume]}}}
    with pytest.raises(PodSecurityError, match=path.replace("[", r"\[").replace("]", r"\]")):
        plan(make_body(spec), fetch, OperatorSettings())


def test_a_null_source_beside_a_forbidden_one_is_forbidden_at_restricted_too() -> None:
    volume = {"name": "n", "emptyDir": None, "nfs": {"server": "s", "path": "/"}}
    found = [str(v) for v in violations({"spec": {"volumes": [volume]}}, "restricted")]
    assert any("spec.volumes[0].nfs: nfs volumes are not allowed" in f for f in found), found
