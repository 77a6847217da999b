"""The chart's monitoring: the ServiceMonitor finds the Services the operator really builds, and
every PromQL expression of the Grafana dashboard names only series that exist — the runtime's own
(from its prometheus-client registry) or kube-state-metrics' named here."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from radixserve.server.metrics import ServerMetrics
from radixserve_operator.builders import build_service
from radixserve_operator.crd import openapi_schema
from radixserve_operator.spec import ServiceSpec, apply_defaults, parse_spec
from tests.deploy.support import CHART_DIR, REPO, VALUE_SETS, of_kind, one

MONITORING = VALUE_SETS["monitoring"]
DASHBOARD_FILE = CHART_DIR / "dashboards" / "radixserve.json"
# series the dashboard reads from outside the runtime: kube-state-metrics' GPU requests
EXTERNAL = frozenset({"kube_pod_container_resource_requests"})
_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
             "histogram": ("_bucket", "_sum", "_count", "_created")}
_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                       "group_right", "bool", "offset", "inf", "nan"})


def _series_names(family: Metric) -> set[str]:
    """What /metrics shows for a family, whether or not it has samples yet (a labelled counter
    has none until its first label set)."""
    return {family.name + s for s in _SUFFIXES[family.type]}


def runtime_series() -> set[str]:
    return {n for fam in ServerMetrics().registry.collect() for n in _series_names(fam)}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label
    names (inside {…} or the lists of by/on/…), strings or durations."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings, Grafana variables inside them
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges, $__rate_interval
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for m in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)\s*(\()?", expr):
        if m.group(2) is None and m.group(1).lower() not in _KEYWORDS:
            names.add(m.group(1))
    return names


def test_metric_names_finds_metrics_and_nothing_else() -> None:
    """The parser the dashboard test relies on: a wrong parser would pass anything."""
    expr = ('histogram_quantile(0.99, sum by (le) (rate(a_bucket{namespace=~"$namespace",le!="x"}[$__rate_interval])))'
            ' / on (pod) group_left() b_total and c offset 5m + sum without (job) (d)')
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "d"}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if var["type"] == "query":
            query = query["query"] if isinstance(query, dict) else query
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            assert m, f"variable {var['name']}: expected label_values(SERIES, LABEL), got {query!r}"
            out.append(m.group(1))
    return out


def test_every_dashboard_query_names_only_series_that_exist() -> None:
    known = runtime_series() | EXTERNAL
    exprs = _exprs(_dashboard())
    assert exprs
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        assert names <= known, f"{sorted(names - known)} not exported by the runtime: {expr!r}"


def test_a_panel_naming_a_missing_metric_is_caught() -> None:
    dashboard = _dashboard()
    dashboard["panels"][0]["targets"][0]["expr"] = "sum(rate(radixserve_no_such_metric_total[5m]))"
    known = runtime_series() | EXTERNAL
    assert any(not metric_names(e) <= known for e in _exprs(dashboard))


def test_dashboard_covers_what_an_operator_of_llm_serving_watches() -> None:
    exprs = " ".join(_exprs(_dashboard()))
    for needed in ("radixserve_generation_tokens_total", "radixserve_time_to_first_token_seconds_bucket",
                   "radixserve_time_per_output_token_seconds_bucket", "radixserve_e2e_request_latency_seconds_bucket",
                   "radixserve_waiting", "radixserve_running", "radixserve_kv_cache_usage_ratio", "radixserve_kv_pages_total",
                   "radixserve_prefix_cache_hit_tokens_total", 'resource="nvidia_com_gpu"'):
        assert needed in exprs, needed
    for q in ("0.5", "0.99"):
        assert f"histogram_quantile({q}, " in exprs
    ids = [p["id"] for p in _dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_configmap_carries_the_file_and_the_sidecar_label(render) -> None:
    cm = one(render(MONITORING), "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert json.loads(cm["data"]["radixserve.json"]) == _dashboard()


def _services() -> list[dict[str, Any]]:
    """The Services the operator builds for the samples, as it builds them."""
    out = []
    for path in sorted((REPO / "manifests" / "samples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc = apply_defaults(openapi_schema(), copy.deepcopy(doc))
                spec: ServiceSpec = parse_spec({**doc, "metadata": {**doc["metadata"], "namespace": "llm"}})
                out.append(build_service(spec))
    assert out
    return out


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, "only matchLabels is evaluated here"
    return selector["matchLabels"].items() <= labels.items()


def test_service_monitor_scrapes_every_runtime_service_in_every_namespace(render) -> None:
    objects = render(MONITORING)
    (sm,) = of_kind(objects, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = sm["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
    # the runtime wants its API key on /metrics: Prometheus sends the Secret's as a bearer token
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "llm-key", "key": "api-key"}}
    for svc in _services():
        assert _selects(spec["selector"], svc["metadata"]["labels"]), svc["metadata"]["labels"]
        assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}


def test_service_monitor_selects_nothing_the_chart_itself_renders(render) -> None:
    """The operator's own objects carry the chart's labels, not the runtime's."""
    objects = render(MONITORING)
    selector = one(objects, "ServiceMonitor")["spec"]["selector"]
    assert not [o["kind"] for o in objects if _selects(selector, o["metadata"].get("labels", {}))]


def test_service_monitor_can_be_limited_to_namespaces_and_scrape_without_a_key(render) -> None:
    values = {"monitoring": {"serviceMonitor": {"enabled": True, "namespaces": ["team-a", "team-b", "team-a"]}}}
    spec = one(render(values), "ServiceMonitor")["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert "authorization" not in spec["endpoints"][0]


@pytest.mark.parametrize("name", [n for n in VALUE_SETS if n != "monitoring"])
def test_monitoring_is_off_unless_asked_for(name: str, render) -> None:
    objects = render(VALUE_SETS[name])
    assert not of_kind(objects, "ServiceMonitor")
    assert not [o for o in of_kind(objects, "ConfigMap") if "grafana_dashboard" in o["metadata"]["labels"]]
