"""Builders: for a table of specs, the Deployment and Service carry the right command, GPU limits,
probes, volumes, security context and owner reference, and every object passes the real
Kubernetes OpenAPI schema (kubernetes-validate, strict: unknown fields fail)."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve_operator.reconcile import plan

BASE_ARGS = ["--host", "0.0.0.0", "--port", "8000"]
TAIL = ["--memory-ratio", "0.9", "--shutdown-timeout", "30"]

# name -> (spec, expected args, expected GPU limit or None, extra checks on the pod spec)
CASES: dict[str, tuple[dict[str, Any], list[str], int | None]] = {
    "defaults": ({}, ["serve", "--tp", "1", *BASE_ARGS, *TAIL], 1),
    "lora": (
        {"model": {"source": "Qwen/Qwen3-0.6B"},
         "lora": {"maxLoraRank": 32, "adapters": [{"name": "sql", "source": "org/sql-lora"},
                                                  {"name": "chat", "source": "pvc://adapters/chat"}]}},
        ["serve", "--model", "Qwen/Qwen3-0.6B", "--tp", "1", *BASE_ARGS, *TAIL, "--enable-lora",
         "--max-lora-rank", "32", "--lora-paths", "sql=org/sql-lora", "chat=/lora/adapters/chat"],
        1,
    ),
    "explicit-tp": (
        {"model": {"source": "Qwen/Qwen3-32B"}, "parallelism": {"tensor": 4}},
        ["serve", "--model", "Qwen/Qwen3-32B", "--tp", "4", *BASE_ARGS, *TAIL],
        4,
    ),
    "auto-0.6b-80g": (
        {
            "model": {"source": "Qwen/Qwen3-0.6B"},
            "parallelism": {"tensor": "auto"},
            "gpu": {"memoryGiB": 80},
        },
        ["serve", "--model", "Qwen/Qwen3-0.6B", "--tp", "1", *BASE_ARGS, *TAIL],
        1,
    ),
    "auto-14b-80g": (
        {
            "model": {"source": "Qwen/Qwen3-14B"},
            "parallelism": {"tensor": "auto"},
            "gpu": {"memoryGiB": 80},
        },
        ["serve", "--model", "Qwen/Qwen3-14B", "--tp", "1", *BASE_ARGS, *TAIL],
        1,
    ),
    "auto-32b-48g": (
        {
            "model": {"source": "Qwen/Qwen3-32B"},
            "parallelism": {"tensor": "auto"},
            "gpu": {"memoryGiB": 48},
        },
        ["serve", "--model", "Qwen/Qwen3-32B", "--tp", "2", *BASE_ARGS, *TAIL],
        2,
    ),
    "auto-70b-80g": (
        {
            "model": {"source": "meta-llama/Llama-3.1-70B-Instruct"},
            "parallelism": {"tensor": "auto"},
            "gpu": {"memoryGiB": 80},
        },
        ["serve", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--tp", "2", *BASE_ARGS, *TAIL],
        2,
    ),
    "auto-70b-141g": (
        {
            "model": {"source": "meta-llama/Llama-3.1-70B-Instruct"},
            "parallelism": {"tensor": "auto"},
            "gpu": {"memoryGiB": 141},
        },
        ["serve", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--tp", "2", *BASE_ARGS, *TAIL],
        2,
    ),
    "moe-235b-80g": (
        {
            "model": {"source": "Qwen/Qwen3-235B-A22B"},
            "parallelism": {"tensor": "auto"},
            "gpu": {"memoryGiB": 80},
        },
        ["serve", "--model", "Qwen/Qwen3-235B-A22B", "--tp", "8", *BASE_ARGS, *TAIL],
        8,
    ),
    "moe-235b-141g": (
        {
            "model": {"source": "Qwen/Qwen3-235B-A22B"},
            "parallelism": {"tensor": "auto"},
            "gpu": {"memoryGiB": 141},
        },
        ["serve", "--model", "Qwen/Qwen3-235B-A22B", "--tp", "4", *BASE_ARGS, *TAIL],
        4,
    ),
    "pvc-cache-and-source": (
        {
            "model": {"source": "pvc://weights/llama/70b", "servedName": "llama-70b"},
            "parallelism": {"tensor": 8},
            "modelCache": {"pvc": {"claimName": "hf-cache"}},
        },
        [
            "serve",
            "--model",
            "/models/weights/llama/70b",
            "--tp",
            "8",
            *BASE_ARGS,
            "--served-model-name",
            "llama-70b",
            *TAIL,
        ],
        8,
    ),
    "tolerations": (
        {
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "nodeSelector": {"gpu.product": "H200"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
        ["serve", "--tp", "1", *BASE_ARGS, *TAIL],
        1,
    ),
    "recreate": (
        {"rollout": {"strategy": "Recreate"}},
        ["serve", "--tp", "1", *BASE_ARGS, *TAIL],
        1,
    ),
    "cpu": (
        {"gpu": {"enabled": False}, "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
        ["serve", "--tp", "1", *BASE_ARGS, "--device", "cpu", *TAIL],
        None,
    ),
    "all-runtime-flags": (
        {
            "model": {"source": "Qwen/Qwen3-0.6B", "revision": "v1.1"},
            "gpu": {"resourceName": "amd.com/gpu"},
            "runtime": {
                "dtype": "bfloat16",
                "kvCacheDtype": "fp8_e4m3",
                "pageSize": 16,
                "contextLength": 8192,
                "samplingDefaults": "openai",
                "maxRunningRequests": 64,
                "maxPrefillLength": 4096,
                "memoryRatio": 0.85,
                "cudaGraphMaxBs": 32,
                "prefillGraphMaxTokens": 1024,
                "attention": "flashinfer,triton",
                "cache": "naive",
                "shutdownTimeoutSeconds": 60,
                "extraArgs": ["--seed", "7"],
            },
            "apiKeySecretRef": {"name": "llm-key"},
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
            "resources": {"limits": {"memory": "64Gi", "amd.com/gpu": 3}},
        },
        [
            "serve",
            "--model",
            "Qwen/Qwen3-0.6B",
            "--tp",
            "1",
            *BASE_ARGS,
            "--dtype",
            "bfloat16",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--page-size",
            "16",
            "--context-length",
            "8192",
            "--sampling-defaults",
            "openai",
            "--max-running-requests",
            "64",
            "--max-prefill-length",
            "4096",
            "--memory-ratio",
            "0.85",
            "--cuda-graph-max-bs",
            "32",
            "--prefill-graph-max-tokens",
            "1024",
            "--attn",
            "flashinfer,triton",
            "--cache",
            "naive",
            "--shutdown-timeout",
            "60",
            "--seed",
            "7",
        ],
        1,
    ),
}


# auto TP for the 0.6B/14B/32B/70B-sized configs on 80 GB and 141 GB GPUs (arithmetic in test_tp_plan.py)
for _repo, _tp80, _tp141 in [
    ("Qwen/Qwen3-0.6B", 1, 1),
    ("Qwen/Qwen3-14B", 1, 1),
    ("Qwen/Qwen3-32B", 1, 1),
    ("meta-llama/Llama-3.1-70B-Instruct", 2, 2),
]:
    for _gib, _tp in ((80, _tp80), (141, _tp141)):
        CASES[f"grid-{_repo.split('/')[1]}-{_gib}g"] = (
            {
                "model": {"source": _repo},
                "parallelism": {"tensor": "auto"},
                "gpu": {"memoryGiB": _gib},
            },
            ["serve", "--model", _repo, "--tp", str(_tp), *BASE_ARGS, *TAIL],
            _tp,
        )


def _build(
    make_body, fetch, spec: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    body = make_body(spec)
    _, _, objects, _ = plan(body, fetch)
    deployment, service, network_policy = objects
    assert network_policy["kind"] == "NetworkPolicy"
    return body, deployment, service


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("case", sorted(CASES))
def test_objects_validate_against_kubernetes_schema(
    case: str, make_body, fetch, validate_k8s
) -> None:
    _, deployment, service = _build(make_body, fetch, CASES[case][0])
    validate_k8s(deployment)
    validate_k8s(service)


@pytest.mark.parametrize("case", sorted(CASES))
def test_command_and_gpu_limit(case: str, make_body, fetch) -> None:
    spec, args, gpus = CASES[case]
    _, deployment, _ = _build(make_body, fetch, spec)
    c = _container(deployment)
    assert "command" not in c, "the image's ENTRYPOINT (tini -- radixserve) runs the args"
    assert c["args"] == args
    resource = spec.get("gpu", {}).get("resourceName", "nvidia.com/gpu")
    limits = c.get("resources", {}).get("limits", {})
    if gpus is None:
        assert not any("gpu" in k for k in limits) and not any(
            "gpu" in k for k in c["resources"].get("requests", {})
        )
    else:
        assert limits[resource] == gpus
        assert [k for k in limits if "gpu" in k] == [resource]


@pytest.mark.parametrize("case", sorted(CASES))
def test_owner_reference_labels_and_security(case: str, make_body, fetch) -> None:
    _, deployment, service = _build(make_body, fetch, CASES[case][0])
    for obj in (deployment, service):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "radixserve.dev/v1alpha1",
            "kind": "InferenceService",
            "name": "llm",
            "uid": "uid-llm",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert obj["metadata"]["namespace"] == "serving"
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "radixserve"
        assert labels["app.kubernetes.io/instance"] == "llm"
        assert labels["app.kubernetes.io/managed-by"] == "radixserve-operator"
        assert labels["app.kubernetes.io/component"] == "inference"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    sc = _container(deployment)["securityContext"]
    assert sc == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert (
        deployment["spec"]["selector"]["matchLabels"]
        == service["spec"]["selector"]
        == {"app.kubernetes.io/name": "radixserve", "app.kubernetes.io/instance": "llm"}
    )


def test_default_probes_volumes_and_rollout(make_body, fetch) -> None:
    _, deployment, service = _build(make_body, fetch, {})
    c, pod = _container(deployment), deployment["spec"]["template"]["spec"]
    assert c["startupProbe"] == {
        "httpGet": {"path": "/health", "port": "http"},
        "initialDelaySeconds": 0,
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 180,
    }
    assert (
        c["readinessProbe"]["httpGet"]
        == c["livenessProbe"]["httpGet"]
        == {"path": "/health", "port": "http"}
    )
    assert (c["readinessProbe"]["periodSeconds"], c["livenessProbe"]["periodSeconds"]) == (10, 20)
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        {"name": "model-cache", "emptyDir": {"sizeLimit": "100Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}},
    ]
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]} == {
        "/dev/shm": "dshm",
        "/models-cache": "model-cache",
        "/tmp": "tmp",
    }
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RADIXSERVE_CACHE_DIR"] == "/models-cache"
    assert env["HF_HOME"].startswith("/models-cache/")
    assert pod["terminationGracePeriodSeconds"] > 30  # longer than the server's 30 s drain
    # surge first: the last ready replica stays until its replacement is ready
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert deployment["spec"]["progressDeadlineSeconds"] > 180 * 10  # beyond the startup window
    assert c["image"] == "ghcr.io/radixserve/radixserve:0.1.0"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["type"] == "ClusterIP"


def test_pvc_cache_and_pvc_source_volumes(make_body, fetch) -> None:
    _, deployment, _ = _build(make_body, fetch, CASES["pvc-cache-and-source"][0])
    pod = deployment["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["model-cache"] == {
        "name": "model-cache",
        "persistentVolumeClaim": {"claimName": "hf-cache"},
    }
    assert vols["model-source"]["persistentVolumeClaim"] == {
        "claimName": "weights",
        "readOnly": True,
    }
    mounts = {m["name"]: m for m in _container(deployment)["volumeMounts"]}
    assert mounts["model-source"] == {
        "name": "model-source",
        "mountPath": "/models/weights",
        "readOnly": True,
    }


def test_scheduling_fields_pass_through(make_body, fetch) -> None:
    spec = CASES["tolerations"][0]
    _, deployment, _ = _build(make_body, fetch, spec)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["tolerations"] == spec["tolerations"]
    assert pod["nodeSelector"] == {"gpu.product": "H200"}
    assert pod["affinity"] == spec["affinity"]


def test_recreate_has_no_rolling_parameters(make_body, fetch) -> None:
    _, deployment, _ = _build(make_body, fetch, CASES["recreate"][0])
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_cpu_replica(make_body, fetch) -> None:
    _, deployment, _ = _build(make_body, fetch, CASES["cpu"][0])
    c = _container(deployment)
    assert c["image"] == "ghcr.io/radixserve/radixserve:0.1.0-cpu"
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}
    assert deployment["metadata"]["annotations"]["radixserve.dev/gpus-per-replica"] == "0"


def test_api_key_revision_env_and_user_gpu_limit_overridden(make_body, fetch) -> None:
    _, deployment, _ = _build(make_body, fetch, CASES["all-runtime-flags"][0])
    c, pod = _container(deployment), deployment["spec"]["template"]["spec"]
    env = {e["name"]: e for e in c["env"]}
    assert env["RADIXSERVE_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "llm-key", "key": "api-key", "optional": False}
    }
    assert env["RADIXSERVE_MODEL_REVISION"]["value"] == "v1.1"
    assert env["NCCL_DEBUG"]["value"] == "INFO"
    assert c["resources"]["limits"] == {
        "memory": "64Gi",
        "amd.com/gpu": 1,
    }  # the TP size, not the user's 3
    assert pod["terminationGracePeriodSeconds"] > 60


def test_probe_overrides_and_service(make_body, fetch) -> None:
    spec = {
        "probes": {
            "startup": {"failureThreshold": 360, "periodSeconds": 5},
            "liveness": {"timeoutSeconds": 9},
        },
        "service": {"type": "LoadBalancer", "port": 80},
        "apiKeySecretRef": {"name": "llm-key"},  # exposed: a key is required
    }
    _, deployment, service = _build(make_body, fetch, spec)
    c = _container(deployment)
    assert (c["startupProbe"]["failureThreshold"], c["startupProbe"]["periodSeconds"]) == (360, 5)
    assert (c["livenessProbe"]["timeoutSeconds"], c["livenessProbe"]["periodSeconds"]) == (9, 20)
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"][0]["port"] == 80
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_generation_and_tp_recorded_on_deployment_not_pods(make_body, fetch) -> None:
    body = make_body({"parallelism": {"tensor": 1}}, generation=7)
    _, _, (deployment, *_), _ = plan(body, fetch)
    notes = deployment["metadata"]["annotations"]
    assert (notes["radixserve.dev/generation"], notes["radixserve.dev/tensor-parallel-size"]) == (
        "7",
        "1",
    )
    template_notes = deployment["spec"]["template"]["metadata"].get("annotations", {})
    assert not any(
        k.startswith("radixserve.dev/") for k in template_notes
    )  # no restart per generation


def test_schema_validation_is_not_vacuous(make_body, fetch, validate_k8s) -> None:
    import kubernetes_validate

    _, deployment, _ = _build(make_body, fetch, {})
    _container(deployment)["startupProbe"]["httpGet"]["port"] = ["http"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(deployment)


@pytest.mark.parametrize("case", sorted(CASES))
def test_pod_args_parse_with_the_runtime_cli(case: str, make_body, fetch) -> None:
    """The operator and the runtime agree on flags: radixserve's own parser accepts every command
    the operator writes (argparse exits on an unknown flag or a bad value)."""
    import argparse

    from radixserve.cli import serve as serve_cli

    _, deployment, _ = _build(make_body, fetch, CASES[case][0])
    parser = argparse.ArgumentParser(prog="radixserve")
    serve_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(_container(deployment)["args"])
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port == 8000
