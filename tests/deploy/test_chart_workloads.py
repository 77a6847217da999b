"""What the chart runs: the operator Deployment (flags, probe, hardening, values wiring), the
optional NVIDIA device plugin DaemonSet, and NOTES.txt."""

from __future__ import annotations

import helm_python as helm

from tests.deploy.support import CHART_DIR, VALUE_SETS, of_kind, one


def _container(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_default_operator_runs_cluster_wide_with_liveness_probe(render) -> None:
    objects = render()
    dep = one(objects, "Deployment")
    c = _container(objects)
    assert c["image"] == "ghcr.io/radixserve/radixserve-operator:0.1.0"
    assert c["args"] == ["--all-namespaces", "--liveness-port=8080"]
    probe = c["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}[probe["port"]] == 8080
    assert dep["spec"]["replicas"] == 1
    assert (
        dep["spec"]["selector"]["matchLabels"].items()
        <= dep["spec"]["template"]["metadata"]["labels"].items()
    )
    assert not of_kind(objects, "Namespace") and not of_kind(objects, "DaemonSet")


def test_operator_pod_is_hardened(render) -> None:
    for values in VALUE_SETS.values():
        pod = one(render(values), "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        sc = pod["containers"][0]["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "hostPath" not in str(pod["volumes"])


def test_values_reach_the_operator_pod(render) -> None:
    objects = render(VALUE_SETS["customised"])
    dep = one(objects, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert dep["metadata"]["name"] == "llm-operator"
    assert c["image"] == "registry.example/op:dev" and c["imagePullPolicy"] == "Always"
    assert c["args"] == ["--all-namespaces", "--liveness-port=9090", "--verbose", "--standalone"]
    assert {p["containerPort"] for p in c["ports"]} == {9090}
    assert {"name": "TZ", "value": "UTC"} in c["env"]
    assert c["resources"]["limits"] == {"cpu": 1, "memory": "1Gi"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert "nodeAffinity" in pod["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert dep["spec"]["template"]["metadata"]["annotations"] == {"prometheus.io/scrape": "false"}
    assert dep["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    ns = one(objects, "Namespace")
    assert ns["metadata"]["name"] == "radixserve-system"


def test_peering_flag_and_replicas(render) -> None:
    objects = render(VALUE_SETS["peering"])
    assert one(objects, "Deployment")["spec"]["replicas"] == 2
    assert "--peering=radixserve" in _container(objects)["args"]


def test_device_plugin_is_off_by_default_and_wired_from_values(render) -> None:
    assert not of_kind(render(), "DaemonSet")
    ds = one(render(VALUE_SETS["device-plugin"]), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    # it registers with the kubelet through the device-plugin socket directory
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert mounts == host == {"device-plugin": "/var/lib/kubelet/device-plugins"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert (
        ds["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )


def _notes(values: dict) -> str:
    with helm.Chart.load(CHART_DIR) as chart:
        return chart.render(values, name="rs", namespace="llm")["radixserve/templates/NOTES.txt"]


def test_notes_tell_how_to_reach_the_endpoint() -> None:
    notes = _notes({})
    assert "http://NAME.llm.svc:8000/v1" in notes
    assert "kubectl port-forward -n llm svc/NAME 8000:8000" in notes
    assert "/v1/chat/completions" in notes
    assert "devicePlugin.enabled=true" in notes
    assert "devicePlugin.enabled" not in _notes(VALUE_SETS["device-plugin"])
    assert "watching team-a, team-b" in _notes(VALUE_SETS["namespaced-strict"])
