"""What the deploy tests share: paths, the Kubernetes version, the chart value sets."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "radixserve"
CRD_FILE = CHART_DIR / "crds" / "inferenceservices.radixserve.dev.yaml"
K8S_VERSION = "1.35.0"  # a current release that kubernetes-validate ships schemas for

# Value sets every chart test renders: the defaults and the overrides users reach for.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"operator": {"scope": "namespaced"}},
    "namespaced-strict": {
        "operator": {"scope": "namespaced", "watchNamespaces": ["team-a", "team-b"]},
        "rbac": {"readNodes": False, "readCRDs": False},
    },
    "peering": {"operator": {"replicas": 2, "peering": "radixserve"}},
    "device-plugin": {
        "devicePlugin": {
            "enabled": True,
            "image": {"tag": "v0.17.2"},
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "runtimeClassName": "nvidia",
            "resources": {"limits": {"memory": "64Mi"}},
        }
    },
    "sample-cpu": {"sample": {"enabled": True}},
    "sample-gpu": {"sample": {"enabled": True, "variant": "gpu", "name": "qwen"}},
    "production": {
        "operator": {"prometheusUrl": "http://prometheus.monitoring.svc:9090"},
        "runtime": {"image": {"repository": "registry.example/radixserve", "tag": "1.2.3"}},
        "prometheusAdapter": {"rules": {"enabled": True, "rateInterval": "2m"}},
        "test": {
            "inferenceService": "qwen3-0-6b",
            "namespace": "llm",
            "apiKeySecretRef": {"name": "llm-key"},
        },
    },
    "monitoring": {
        "monitoring": {
            "serviceMonitor": {
                "enabled": True,
                "interval": "15s",
                "labels": {"release": "kube-prometheus-stack"},
                "apiKeySecretRef": {"name": "llm-key"},
            },
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "LLM"},
            },
        }
    },
    "customised": {
        "fullnameOverride": "llm",
        "namespace": {"create": True},
        "serviceAccount": {"create": False, "name": "existing-sa"},
        "rbac": {"create": False},
        "operator": {
            "image": {"repository": "registry.example/op", "tag": "dev", "pullPolicy": "Always"},
            "imagePullSecrets": [{"name": "regcred"}],
            "verbose": True,
            "livenessPort": 9090,
            "extraArgs": ["--standalone"],
            "env": [{"name": "TZ", "value": "UTC"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/arch",
                                        "operator": "In",
                                        "values": ["amd64", "arm64"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "priorityClassName": "system-cluster-critical",
            "podAnnotations": {"prometheus.io/scrape": "false"},
            "podLabels": {"team": "ml"},
            "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": 1, "memory": "1Gi"}},
        },
    },
}


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_manifests", REPO / "scripts" / "gen_manifests.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str) -> dict:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]
