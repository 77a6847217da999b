"""The model cache on a real control plane: a hub model's pods get the download
init container, HF_HUB_OFFLINE and the HF token's secretKeyRef; a shared ReadWriteOnce claim under
two replicas is flagged in the status and by an event; a PVC per replica is a StatefulSet whose
claims the StatefulSet controller creates, the PV controller binds and the scheduler honours, with
the InferenceService Ready from the StatefulSet's status and the claims garbage-collected with it;
the cache's CEL rules judged by the API server."""

from __future__ import annotations

import json

import pytest

from tests.cluster.scenario import (
    Stack,
    apply,
    condition,
    delete_and_wait,
    get,
    gpu_spec,
    rsvc,
    try_apply,
    wait_ready,
)
from tests.e2e.kind_cluster import wait_for

pytestmark = pytest.mark.cluster


# Qwen3-0.6B's shape: with hints the operator never asks the (unreachable) hub for config.json.
SHAPE = {"parameterCount": "0.6B", "numAttentionHeads": 16, "numKeyValueHeads": 8,
         "numHiddenLayers": 28, "headDim": 128}  # fmt: skip


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _claims(stack: Stack, namespace: str, name: str) -> list[dict]:
    out = stack.kubectl.json(
        "get", "pvc", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}"
    )
    return [c for c in out["items"] if not c["metadata"].get("deletionTimestamp")]


def test_hub_model_init_container_token_and_shared_rwo_claim(stack: Stack, namespace: str) -> None:
    name = "hub"
    claim = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "hf-cache"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    apply(stack, namespace, claim)
    model = {
        "source": "Qwen/Qwen3-0.6B",
        "parameters": SHAPE,
        "hfTokenSecret": {"name": "hf-token"},
        "cache": {"type": "sharedPVC", "claimName": "hf-cache"},
    }
    apply(stack, namespace, rsvc(name, gpu_spec(1, 2, model=model)))

    def flagged() -> dict | None:
        c = condition(get(stack, namespace, "rsvc", name), "CacheSharedReadWriteOnce")
        return c if c.get("status") == "True" else None

    c = wait_for("the CacheSharedReadWriteOnce condition", flagged, 60, 0.5)
    assert c["reason"] == "ReadWriteOnceClaimShared" and "ReadWriteMany" in c["message"], c
    def event() -> str | None:  # posted right after the condition: wait for it, not race it
        said = stack.kubectl(
            "get", "events", "-n", namespace, "--field-selector",
            f"involvedObject.name={name},reason=ReadWriteOnceClaimShared",
            "-o", "jsonpath={.items[*].message}",
        )  # fmt: skip
        return said or None

    assert "hf-cache" in wait_for("the ReadWriteOnceClaimShared event", event, 30, 0.5)

    pod = get(stack, namespace, "deployment", name)["spec"]["template"]["spec"]
    (init,), (server,) = pod["initContainers"], pod["containers"]
    assert init["name"] == "model-download" and init["image"] == server["image"]
    assert init["args"] == ["download", "Qwen/Qwen3-0.6B"]
    token = {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN", "optional": False}}
    assert _env(init)["HF_TOKEN"] == token and "HF_TOKEN" not in _env(server)  # server: offline
    assert _env(server)["HF_HUB_OFFLINE"] == "1" and "HF_HUB_OFFLINE" not in _env(init)
    probe = server["startupProbe"]
    window = probe["periodSeconds"] * probe["failureThreshold"]
    assert window >= 1800 > int(_env(server)["RADIXSERVE_STARTUP_TIMEOUT"])
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["model-cache"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert "nvidia.com/gpu" not in str(init.get("resources"))

    # one replica replaced in place: nothing to share any more (the default rollout's surge pod
    # would share it)
    stack.kubectl("patch", "rsvc", name, "-n", namespace, "--type=merge", "-p",
                  json.dumps({"spec": {"replicas": 1, "rollout": {"maxSurge": 0}}}))
    wait_for(
        "the condition to clear",
        lambda: (
            condition(get(stack, namespace, "rsvc", name), "CacheSharedReadWriteOnce").get("status")
            == "False"
        ),
        60,
        0.5,
    )
    delete_and_wait(stack, namespace, name)


def test_pvc_per_replica_statefulset_ready_and_its_claims(stack: Stack, namespace: str) -> None:
    name = "per-replica"
    sc = f"rs-{namespace}"  # cluster-scoped: unique per run
    storage_class = {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": sc},
        "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate",
    }  # fmt: skip
    volumes = [
        {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"{sc}-{i}", "labels": {"radixserve-test": namespace}},
            "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": sc, "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": f"/tmp/{sc}-{i}"}},
        }
        for i in range(2)
    ]  # fmt: skip
    apply(stack, namespace, storage_class, *volumes)
    try:
        cache = {"type": "pvcPerReplica", "size": "1Gi", "storageClassName": sc}
        spec = gpu_spec(
            1, 2, model={"source": "Qwen/Qwen3-0.6B", "parameters": SHAPE, "cache": cache}
        )
        apply(stack, namespace, rsvc(name, spec))
        obj = wait_ready(stack, namespace, name, 2, timeout=90)  # from the StatefulSet's status
        assert condition(obj)["reason"] == "RolloutComplete"

        sts = get(stack, namespace, "statefulset", name)
        assert [r["kind"] for r in sts["metadata"]["ownerReferences"]] == ["InferenceService"]
        assert get(stack, namespace, "deployment", name) is None
        assert sts["spec"]["template"]["spec"]["initContainers"][0]["name"] == "model-download"
        claims = {c["metadata"]["name"]: c for c in _claims(stack, namespace, name)}
        assert set(claims) == {f"model-cache-{name}-0", f"model-cache-{name}-1"}
        for c in claims.values():  # accepted as built, and bound by the PV controller
            assert c["spec"]["storageClassName"] == sc
            assert c["spec"]["resources"]["requests"]["storage"] == "1Gi"
            assert c["status"]["phase"] == "Bound"
        pods = stack.kubectl.json(
            "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}"
        )
        assert sorted(p["metadata"]["name"] for p in pods["items"]) == [f"{name}-0", f"{name}-1"]

        # a bigger cache: the API server refuses to change a claim template, so the operator
        # recreates the StatefulSet leaving its pods (adopted again, not restarted) and claims
        uids = {p["metadata"]["uid"] for p in pods["items"]}
        stack.kubectl(
            "patch", "rsvc", name, "-n", namespace, "--type", "merge",
            "-p", '{"spec": {"model": {"cache": {"size": "2Gi"}}}}',
        )  # fmt: skip

        def recreated() -> dict | None:
            got = get(stack, namespace, "statefulset", name) or {}
            tpl = (got.get("spec") or {}).get("volumeClaimTemplates") or [{}]
            size = tpl[0].get("spec", {}).get("resources", {}).get("requests", {}).get("storage")
            return got if size == "2Gi" else None

        sts2 = wait_for("the StatefulSet with the new claim template", recreated, 60, 0.5)
        assert sts2["metadata"]["uid"] != sts["metadata"]["uid"]
        wait_ready(stack, namespace, name, 2, timeout=60)
        pods = stack.kubectl.json(
            "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}"
        )
        assert {p["metadata"]["uid"] for p in pods["items"]} == uids
        assert {p["metadata"]["ownerReferences"][0]["uid"] for p in pods["items"]} == {
            sts2["metadata"]["uid"]
        }
        assert len(_claims(stack, namespace, name)) == 2  # kept, as they were
        events = stack.kubectl(
            "get", "events", "-n", namespace, "--field-selector",
            f"involvedObject.name={name},reason=CacheClaimsChanged", "-o", "name",
        )  # fmt: skip
        assert events.strip()

        # deleted with the resource: StatefulSet, pods, then (retention policy) the claims
        delete_and_wait(stack, namespace, name)
        wait_for(
            "the per-replica claims deleted", lambda: not _claims(stack, namespace, name), 60, 1
        )
    finally:
        stack.kubectl(
            "delete", "pv", "-l", f"radixserve-test={namespace}", "--wait=false", check=False
        )
        stack.kubectl("delete", "storageclass", sc, "--ignore-not-found", check=False)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"model": {"cache": {"type": "sharedPVC"}}}, "type sharedPVC needs claimName"),
        ({"model": {"cache": {"type": "pvcPerReplica"}}}, "type pvcPerReplica needs size"),
        ({"model": {"cache": {"claimName": "c"}}}, "claimName and readOnly are for type sharedPVC"),
        (
            {
                "model": {"cache": {"type": "pvcPerReplica", "size": "1Gi"}},
                "rollout": {"maxSurge": 1},
            },
            "rollout.strategy must be RollingUpdate with maxSurge 0",
        ),
    ],
    ids=["shared-no-claim", "per-replica-no-size", "claim-on-emptydir", "per-replica-surge"],
)
def test_api_server_refuses_bad_cache_specs(
    stack: Stack, namespace: str, spec: dict, message: str
) -> None:
    accepted, out = try_apply(stack, namespace, rsvc("refused", gpu_spec(1, **spec)))
    assert not accepted and message in out, out
