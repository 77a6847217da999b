"""Production features in the builders and handlers: the partial pod template merged over the
operator's pod, default requests for GPU replicas, preStop and spread, the PodDisruptionBudget,
autoscaling (HPA or KEDA) and the deletion of optional children the spec no longer asks for.
Every built object passes the real Kubernetes schema (kubernetes-validate, strict) except KEDA's,
a CRD."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from radixserve_operator import handlers
from radixserve_operator.builders import default_requests, quantity_bytes
from radixserve_operator.children import target_quantity
from radixserve_operator.reconcile import plan
from radixserve_operator.settings import OperatorSettings
from radixserve_operator.spec import SpecError, parse_spec

TEMPLATE = {
    "nodeSelector": {"gpu.product": "H200", "pool": "serving"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "runtimeClassName": "nvidia",
    "priorityClassName": "llm-high",
    "serviceAccountName": "llm",
    "imagePullSecrets": [{"name": "regcred"}],
    "volumes": [
        {"name": "model-cache", "csi": {"driver": "fuse.example", "volumeAttributes": {"b": "x"}}},
        {"name": "certs", "secret": {"secretName": "ca"}},
    ],
    "container": {
        "volumeMounts": [
            {"name": "certs", "mountPath": "/etc/ssl/custom", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp", "subPath": "t"},
        ],
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "HF_HOME", "value": "/hf"}],
        "resources": {"limits": {"memory": "200Gi"}, "requests": {"cpu": "12"}},
    },
}  # fmt: skip


def _objects(make_body, fetch, spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    _, _, objects, _ = plan(make_body(spec), fetch)
    return {o["kind"]: o for o in objects}


def _pod(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objects["Deployment"]["spec"]["template"]["spec"]


def test_template_merges_over_the_operators_pod(
    make_body, fetch, validate_k8s, monkeypatch
) -> None:
    # the template's ServiceAccount and Secret volume, allowed by the operator's settings
    monkeypatch.setenv("RADIXSERVE_ALLOWED_SERVICE_ACCOUNTS", "llm")
    monkeypatch.setenv("RADIXSERVE_ALLOWED_SECRETS", "ca")
    spec = {
        "model": {"source": "Qwen/Qwen3-0.6B"},
        "parallelism": {"tensor": 2},
        "nodeSelector": {"gpu.product": "H100", "zone": "a"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {}},
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}},
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "template": {"spec": TEMPLATE},
    }
    objects = _objects(make_body, fetch, spec)
    validate_k8s(objects["Deployment"])
    pod = _pod(objects)
    (c,) = pod["containers"]
    assert pod["nodeSelector"] == {"gpu.product": "H200", "zone": "a", "pool": "serving"}
    assert [t["key"] for t in pod["tolerations"]] == ["nvidia.com/gpu", "dedicated"]
    assert pod["affinity"] == TEMPLATE["affinity"]  # replaces spec.affinity
    for key in ("runtimeClassName", "priorityClassName", "serviceAccountName", "imagePullSecrets"):
        assert pod[key] == TEMPLATE[key]
    assert pod["automountServiceAccountToken"] is False
    vols = {v["name"]: v for v in pod["volumes"]}
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "model-cache", "tmp", "certs"]
    assert "csi" in vols["model-cache"] and "emptyDir" not in vols["model-cache"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/tmp"]["subPath"] == "t" and mounts["/etc/ssl/custom"]["readOnly"] is True
    assert len(mounts) == len(c["volumeMounts"]) == 4
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NCCL_DEBUG"] == "WARN" and env["HF_HOME"] == "/hf"  # the template's wins
    assert c["resources"] == {
        "requests": {"cpu": "12", "memory": "64Gi"},
        "limits": {"memory": "200Gi", "nvidia.com/gpu": 2},
    }
    assert "command" not in c and c["args"][0] == "serve"
    assert "topologySpreadConstraints" in pod  # the default spread stays


def test_top_level_fields_still_work_without_a_template(make_body, fetch) -> None:
    spec = {"nodeSelector": {"a": "b"}, "tolerations": [{"key": "k", "operator": "Exists"}]}
    pod = _pod(_objects(make_body, fetch, spec))
    assert pod["nodeSelector"] == {"a": "b"} and pod["tolerations"] == spec["tolerations"]


def test_prestop_grace_period_and_default_spread(make_body, fetch) -> None:
    pod = _pod(_objects(make_body, fetch, {"runtime": {"shutdownTimeoutSeconds": 60}}))
    (c,) = pod["containers"]
    assert c["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    assert pod["terminationGracePeriodSeconds"] == 5 + 60 + 15
    assert pod["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "radixserve",
                    "app.kubernetes.io/instance": "llm",
                }
            },
        }
    ]
    pod = _pod(
        _objects(
            make_body,
            fetch,
            {
                "runtime": {"preStopSeconds": 0},
                "template": {"spec": {"topologySpreadConstraints": []}},
            },
        )
    )
    assert "lifecycle" not in pod["containers"][0] and "topologySpreadConstraints" not in pod
    assert pod["terminationGracePeriodSeconds"] == 30 + 15


def test_spread_does_not_depend_on_replicas(make_body, fetch) -> None:
    """Scaling must never change the pod template (that would restart every pod)."""
    one = _objects(make_body, fetch, {"replicas": 1})["Deployment"]["spec"]["template"]
    four = _objects(make_body, fetch, {"replicas": 4})["Deployment"]["spec"]["template"]
    assert one == four


@pytest.mark.parametrize(
    "tp, shm, expected",
    [(1, "8Gi", ("4", "24Gi")), (2, "8Gi", ("8", "40Gi")), (8, "8Gi", ("32", "136Gi")),
     (1, "512Mi", ("4", "16896Mi")), (1, "1G", ("4", "17338Mi")), (4, 0, ("16", "64Gi"))],
)  # fmt: skip
def test_default_requests_scale_with_tp_and_count_shm(make_body, tp, shm, expected) -> None:
    spec = parse_spec(make_body({"parallelism": {"tensor": tp}, "shmSize": shm}))
    assert default_requests(spec, tp) == {"cpu": expected[0], "memory": expected[1]}


def test_default_requests_yield_to_the_users_request_or_limit(make_body, fetch) -> None:
    res = lambda spec: _pod(_objects(make_body, fetch, spec))["containers"][0]["resources"]
    assert res({}) == {"requests": {"cpu": "4", "memory": "24Gi"}, "limits": {"nvidia.com/gpu": 1}}
    # a memory limit alone: Kubernetes copies it into the request, so no default (it could exceed it)
    assert res({"resources": {"limits": {"memory": "12Gi"}}}) == {
        "requests": {"cpu": "4"},
        "limits": {"memory": "12Gi", "nvidia.com/gpu": 1},
    }
    cpu = res({"gpu": {"enabled": False}})
    assert cpu == {}  # CPU replicas: no defaults


def test_quantities() -> None:
    assert quantity_bytes("8Gi") == 8 * 2**30 and quantity_bytes("1.5G") == 1_500_000_000
    assert quantity_bytes(1000) == 1000 and quantity_bytes("1e3") == 1000
    assert (target_quantity(16), target_quantity(0.8), target_quantity(2.5)) == (
        "16",
        "800m",
        "2500m",
    )
    with pytest.raises(ValueError):
        quantity_bytes("lots")


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"template": {"spec": {"container": {"command": ["sh"]}}}}, "command and args"),
        ({"template": {"spec": {"container": {"resources": {"requests": {"nvidia.com/gpu": 1}}}}}}, "GPU count"),
        ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "must not exceed"),
        ({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}, "needs engine keda"),
        ({"autoscaling": {"maxReplicas": 2, "metric": "kvCache", "target": 2}}, "at most 1"),
    ],
)  # fmt: skip
def test_parser_refuses_what_the_cel_rules_refuse(make_body, spec, message) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(make_body(spec))


def test_operator_settings_choose_the_default_image(make_body, monkeypatch) -> None:
    monkeypatch.setenv("RADIXSERVE_DEFAULT_IMAGE", "registry.example/rs:9")
    monkeypatch.setenv("RADIXSERVE_DEFAULT_CPU_IMAGE", "registry.example/rs:9-cpu")
    assert parse_spec(make_body({})).image == "registry.example/rs:9"
    assert parse_spec(make_body({"gpu": {"enabled": False}})).image == "registry.example/rs:9-cpu"
    assert parse_spec(make_body({"image": "mine:1"})).image == "mine:1"  # the resource wins
    settings = OperatorSettings(image="x:1")
    assert parse_spec(make_body({}), settings).image == "x:1"


def test_main_flags_export_the_settings(monkeypatch) -> None:
    from radixserve_operator.__main__ import export_settings, parse_args

    for name in ("RADIXSERVE_DEFAULT_IMAGE", "RADIXSERVE_PROMETHEUS_URL"):
        monkeypatch.delenv(name, raising=False)
    export_settings(parse_args(["--default-image", "a:1", "--prometheus-url", "http://p:9090"]))
    s = OperatorSettings.from_env()
    assert (s.image, s.prometheus_url) == ("a:1", "http://p:9090")


def test_pdb_only_when_more_than_one_replica_may_serve(make_body, fetch, validate_k8s) -> None:
    assert "PodDisruptionBudget" not in _objects(make_body, fetch, {"replicas": 1})
    pdb = _objects(make_body, fetch, {"replicas": 3})["PodDisruptionBudget"]
    validate_k8s(pdb)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "llm"
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == "uid-llm"
    autoscaled = _objects(make_body, fetch, {"replicas": 1, "autoscaling": {"maxReplicas": 3}})
    assert "PodDisruptionBudget" in autoscaled
    custom = {"replicas": 3, "disruptionBudget": {"maxUnavailable": "25%"}}
    assert (
        _objects(make_body, fetch, custom)["PodDisruptionBudget"]["spec"]["maxUnavailable"] == "25%"
    )
    off = {"replicas": 3, "disruptionBudget": {"enabled": False}}
    assert "PodDisruptionBudget" not in _objects(make_body, fetch, off)


@pytest.mark.parametrize(
    "metric, target, name, quantity",
    [("requests", None, "radixserve_requests_in_flight", "16"),
     ("kvCache", None, "radixserve_kv_cache_usage_ratio", "800m"),
     ("tokens", 750, "radixserve_generation_tokens_per_second", "750")],
)  # fmt: skip
def test_hpa_targets_the_inference_service(
    make_body, fetch, validate_k8s, metric, target, name, quantity
) -> None:
    auto: dict[str, Any] = {"minReplicas": 2, "maxReplicas": 6, "metric": metric}
    if target is not None:
        auto["target"] = target
    objects = _objects(make_body, fetch, {"autoscaling": auto})
    hpa = objects["HorizontalPodAutoscaler"]
    validate_k8s(hpa)
    assert "ScaledObject" not in objects
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "radixserve.dev/v1alpha1",
        "kind": "InferenceService",
        "name": "llm",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": name},
                "target": {"type": "AverageValue", "averageValue": quantity},
            },
        }
    ]
    assert hpa["metadata"]["ownerReferences"][0]["controller"] is True


def test_scaled_object_queries_prometheus(make_body, fetch, monkeypatch) -> None:
    monkeypatch.setenv("RADIXSERVE_PROMETHEUS_URL", "http://prom.monitoring:9090")
    auto = {
        "engine": "keda",
        "minReplicas": 0,
        "maxReplicas": 4,
        "metric": "kvCache",
        "target": 0.75,
    }
    objects = _objects(make_body, fetch, {"autoscaling": auto})
    so = objects["ScaledObject"]
    assert "HorizontalPodAutoscaler" not in objects
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["spec"]["scaleTargetRef"]["kind"] == "InferenceService"
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (0, 4)
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == "http://prom.monitoring:9090" and meta["threshold"] == "0.75"
    sel = 'namespace="serving",pod=~"llm-[a-z0-9]+-[a-z0-9]+"'
    assert (
        meta["query"]
        == f"sum(radixserve_kv_cache_usage_ratio{{{sel}}})"
    )
    own = {
        "engine": "keda",
        "maxReplicas": 2,
        "prometheus": {"serverAddress": "http://p", "query": "sum(x)"},
    }
    meta = _objects(make_body, fetch, {"autoscaling": own})["ScaledObject"]["spec"]["triggers"][0][
        "metadata"
    ]
    assert (meta["serverAddress"], meta["query"]) == ("http://p", "sum(x)")


# --- handlers over the fake cluster
def _cond(resource: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in resource["status"].get("conditions", []) if c["type"] == type_), None)


def test_optional_children_come_and_go_with_the_spec(cluster, memo, make_body) -> None:
    spec = {"replicas": 2, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    kinds = {k for k, _, _ in cluster.objects}
    assert {"PodDisruptionBudget", "HorizontalPodAutoscaler"} <= kinds
    c = _cond(cluster.resource(), "Autoscaling")
    assert (c["status"], c["reason"]) == ("True", "HorizontalPodAutoscalerApplied")
    assert {"Ready", "Progressing", "Degraded"} <= {
        x["type"] for x in cluster.resource()["status"]["conditions"]
    }

    def drop(s: dict[str, Any]) -> None:
        del s["autoscaling"]
        s["replicas"] = 1

    cluster.edit_spec(drop)
    handlers.on_update(body=cluster.resource(), memo=memo, logger=None, diff=())
    assert sorted(k for k, _, _ in cluster.deleted) == [
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    ]
    assert _cond(cluster.resource(), "Autoscaling") is None
    assert ("Deployment", "serving", "llm") in cluster.objects


def test_no_generation_is_ready_before_its_autoscaling_condition_is_written(
    cluster, memo, make_body
) -> None:
    """The cluster tier's race, played deterministically: the Deployment controller finishes the
    scale-down (an event, on another thread) while the update's reconcile is between deleting the
    PDB and removing the Autoscaling condition. No status may say generation 2 is Ready while it
    still carries generation 1's Autoscaling condition."""
    spec = {"replicas": 2, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    snapshots: list[dict[str, Any]] = []
    patch_status, delete = cluster.patch_status, cluster.delete

    def recording_patch(*args: Any, **kwargs: Any) -> None:
        patch_status(*args, **kwargs)
        snapshots.append(cluster.resource())

    def event() -> None:
        cluster.set_rollout(observed=True, updated=1, ready=1, total=1)
        handlers.on_deployment_event(body=cluster.deployment(), memo=memo, type="MODIFIED", logger=None)

    threads: list[threading.Thread] = []

    def delete_then_rollout_done(api_version: str, kind: str, *args: Any, **kwargs: Any) -> None:
        delete(api_version, kind, *args, **kwargs)
        if kind == "PodDisruptionBudget":
            threads.append(threading.Thread(target=event))
            threads[-1].start()
            threads[-1].join(0.5)  # unlocked, the event's refresh lands here, mid-reconcile

    cluster.patch_status, cluster.delete = recording_patch, delete_then_rollout_done

    def drop(s: dict[str, Any]) -> None:
        del s["autoscaling"]
        s["replicas"] = 1

    cluster.edit_spec(drop)
    handlers.on_update(body=cluster.resource(), memo=memo, logger=None, diff=())
    (thread,) = threads
    thread.join(10)
    assert not thread.is_alive()
    ready_for_2 = [
        r for r in snapshots
        if (_cond(r, "Ready") or {}).get("status") == "True"
        and _cond(r, "Ready")["observedGeneration"] == 2
    ]  # fmt: skip
    assert ready_for_2, "the scale-down never made generation 2 Ready"
    assert all(_cond(r, "Autoscaling") is None for r in ready_for_2)


def test_an_hpa_that_is_not_ours_is_left_alone(cluster, memo, make_body) -> None:
    cluster.objects[("HorizontalPodAutoscaler", "serving", "llm")] = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llm", "namespace": "serving"},  # the user's own, no owner
    }
    handlers.on_create(body=cluster.create(make_body({"replicas": 1})), memo=memo, logger=None)
    assert not cluster.deleted and ("HorizontalPodAutoscaler", "serving", "llm") in cluster.objects


def test_missing_keda_is_a_condition_and_one_event_not_a_crash(cluster, memo, make_body) -> None:
    spec = {"replicas": 1, "autoscaling": {"engine": "keda", "minReplicas": 0, "maxReplicas": 2}}
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert ("Deployment", "serving", "llm") in cluster.objects  # it serves anyway
    c = _cond(cluster.resource(), "Autoscaling")
    assert (c["status"], c["reason"]) == ("False", "KEDANotInstalled")
    assert "install KEDA" in c["message"]
    handlers.resync(body=cluster.resource(), memo=memo, logger=None)
    handlers.resync(body=cluster.resource(), memo=memo, logger=None)
    assert cluster.reasons().count("KEDANotInstalled") == 1
    # KEDA gets installed: the next resync applies the ScaledObject
    cluster.missing_apis.clear()
    handlers.resync(body=cluster.resource(), memo=memo, logger=None)
    assert ("ScaledObject", "serving", "llm") in cluster.objects
    c = _cond(cluster.resource(), "Autoscaling")
    assert (c["status"], c["reason"]) == ("True", "ScaledObjectApplied")


def test_autoscaler_writes_replicas_and_the_operator_follows(cluster, memo, make_body) -> None:
    """The HPA writes spec.replicas through the scale subresource: an ordinary spec update, never
    a drift to undo."""
    spec = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}
    handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    template = cluster.deployment()["spec"]["template"]
    cluster.edit_spec(lambda s: s.update(replicas=4))
    handlers.on_update(body=cluster.resource(), memo=memo, logger=None, diff=())
    handlers.on_deployment_event(body=cluster.deployment(), memo=memo, type="MODIFIED", logger=None)
    assert cluster.deployment()["spec"]["replicas"] == 4
    assert cluster.deployment()["spec"]["template"] == template
    from radixserve_operator.reconcile import _drifted

    assert not _drifted(cluster.deployment(), cluster.resource())
