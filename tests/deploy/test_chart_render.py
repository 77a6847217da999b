"""The chart lints and renders with real Helm for every value set, every object is valid
Kubernetes, and values.schema.json turns bad values away before anything renders."""

from __future__ import annotations

import copy

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.deploy.support import CHART_DIR, K8S_VERSION, VALUE_SETS

ERROR, WARNING = 3, 2


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_has_no_errors_or_warnings(name: str) -> None:
    report = helm.lint(
        CHART_DIR,
        VALUE_SETS[name],
        strict=True,
        namespace="radixserve-system",
        kube_version=f"v{K8S_VERSION}",
    )
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert report["total_charts_linted"] == 1
    assert not problems and not report["errors"], problems or report["errors"]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_is_valid_kubernetes(name: str, render) -> None:
    objects = render(VALUE_SETS[name])
    assert any(o["kind"] == "Deployment" for o in objects)
    for obj in objects:
        if obj["apiVersion"].startswith(("radixserve.dev/", "kopf.dev/", "monitoring.coreos.com/")):
            continue  # custom resources: the sample and the ServiceMonitor are checked elsewhere
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "radixserve", obj["kind"]


def test_default_values_pass_the_schema() -> None:
    with helm.Chart.load(CHART_DIR) as chart:
        for values in VALUE_SETS.values():
            chart.validate_schema(chart.merge_values(values))


def test_values_yaml_documents_only_schema_keys() -> None:
    """Every key in values.yaml is declared (the schema forbids unknown keys, so a typo fails)."""
    with helm.Chart.load(CHART_DIR) as chart:
        schema = chart.schema
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())

    def walk(node: dict, props: dict, path: str) -> None:
        for key, value in node.items():
            assert key in props, f"{path}{key} is not in values.schema.json"
            sub = props[key]
            if isinstance(value, dict) and value and "properties" in sub:
                walk(value, sub["properties"], f"{path}{key}.")

    walk(values, schema["properties"], "")


BAD_VALUES = {
    "unknown top-level key": {"operatr": {"replicas": 1}},
    "unknown scope": {"operator": {"scope": "everywhere"}},
    "replicas as a string": {"operator": {"replicas": "2"}},
    "negative replicas": {"operator": {"replicas": -1}},
    "two replicas without peering": {"operator": {"replicas": 2}},
    "watch list in cluster scope": {"operator": {"watchNamespaces": ["team-a"]}},
    "namespace not a DNS label": {
        "operator": {"scope": "namespaced", "watchNamespaces": ["Team_A"]}
    },
    "privileged liveness port": {"operator": {"livenessPort": 80}},
    "bad pull policy": {"operator": {"image": {"pullPolicy": "Sometimes"}}},
    "empty image repository": {"operator": {"image": {"repository": ""}}},
    "bad memory quantity": {"operator": {"resources": {"limits": {"memory": "lots"}}}},
    "unknown resources key": {"operator": {"resources": {"limit": {"memory": "1Gi"}}}},
    "non-string node selector": {"operator": {"nodeSelector": {"gpu": True}}},
    "bad toleration operator": {
        "devicePlugin": {"tolerations": [{"key": "a", "operator": "Maybe"}]}
    },
    "device plugin without tag": {"devicePlugin": {"enabled": True, "image": {"tag": ""}}},
    "enabled as a string": {"devicePlugin": {"enabled": "yes"}},
    "unknown sample variant": {"sample": {"enabled": True, "variant": "tpu"}},
    "sample name not a DNS label": {"sample": {"enabled": True, "name": "My Model"}},
    "rbac flag typo": {"rbac": {"readNode": True}},
    "scrape interval without a unit": {"monitoring": {"serviceMonitor": {"interval": "30"}}},
    "monitoring key typo": {"monitoring": {"serviceMonitor": {"enable": True}}},
    "api key secret without a name": {"monitoring": {"serviceMonitor": {"apiKeySecretRef": {"key": "k"}}}},
    "dashboard label not a string": {"monitoring": {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}},
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_schema_rejects_bad_values(case: str) -> None:
    with helm.Chart.load(CHART_DIR) as chart:
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(chart.merge_values(copy.deepcopy(BAD_VALUES[case])))
        # and `helm install`/`template` refuse them too, before rendering anything
        with pytest.raises(helm.HelmValuesError):
            chart.render(copy.deepcopy(BAD_VALUES[case]), name="rs", namespace="ns")
