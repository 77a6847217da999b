"""The chart's production parts: the operator's default runtime image from values, the Prometheus
Adapter rules, the `helm test` Pod and NOTES.txt's next commands. Every object is also linted and
schema-validated with the other value sets (test_chart_render.py: value set "production")."""

from __future__ import annotations

import helm_python as helm
import pytest
import yaml

from tests.deploy.support import CHART_DIR, VALUE_SETS, of_kind, one


def _env(objects: list[dict]) -> dict[str, str]:
    c = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in c["env"]}


def test_runtime_image_values_reach_the_operator(render) -> None:
    env = _env(render())
    assert env["RADIXSERVE_DEFAULT_IMAGE"] == "ghcr.io/radixserve/radixserve:0.1.0"
    assert env["RADIXSERVE_DEFAULT_CPU_IMAGE"] == "ghcr.io/radixserve/radixserve:0.1.0-cpu"
    assert "RADIXSERVE_PROMETHEUS_URL" not in env
    env = _env(render(VALUE_SETS["production"]))
    assert env["RADIXSERVE_DEFAULT_IMAGE"] == "registry.example/radixserve:1.2.3"
    assert env["RADIXSERVE_DEFAULT_CPU_IMAGE"] == "registry.example/radixserve:1.2.3-cpu"
    assert env["RADIXSERVE_PROMETHEUS_URL"] == "http://prometheus.monitoring.svc:9090"


def test_the_operator_reads_what_the_chart_sets(render, monkeypatch) -> None:
    from radixserve_operator.settings import OperatorSettings

    for name, value in _env(render(VALUE_SETS["production"])).items():
        if value is not None:
            monkeypatch.setenv(name, value)
    s = OperatorSettings.from_env()
    assert (s.image, s.cpu_image) == (
        "registry.example/radixserve:1.2.3",
        "registry.example/radixserve:1.2.3-cpu",
    )


def test_prometheus_adapter_rules_serve_every_autoscaling_metric(render) -> None:
    from radixserve_operator.spec import AUTOSCALING_METRICS

    assert not of_kind(render(), "ConfigMap")
    cm = one(render(VALUE_SETS["production"]), "ConfigMap")
    assert cm["metadata"]["name"] == "rs-radixserve-adapter-rules"
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    served = {r["name"]["as"] for r in rules}
    assert served == {name for name, _ in AUTOSCALING_METRICS.values()}
    for rule in rules:
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        assert (
            "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
        )
    assert any("[2m]" in r["metricsQuery"] for r in rules)  # rateInterval


def test_runtime_exports_the_series_the_rules_read() -> None:
    """The adapter rules and the KEDA queries read series the runtime really exports."""
    from prometheus_client import generate_latest

    from radixserve.server.metrics import ServerMetrics

    text = generate_latest(ServerMetrics().registry).decode()
    for series in (
        "radixserve_running",
        "radixserve_waiting",
        "radixserve_kv_cache_usage_ratio",
        "radixserve_generation_tokens_total",
    ):
        assert f"\n{series} " in text or f"\n{series}{{" in text, series


def test_helm_test_pod_only_when_an_inference_service_is_named(render) -> None:
    assert not of_kind(render(), "Pod")
    pod = one(render(VALUE_SETS["production"]), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["namespace"] == "llm"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["securityContext"]["runAsNonRoot"] is True
    (c,) = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["BASE_URL"]["value"] == "http://qwen3-0-6b.llm.svc:8000"
    assert env["API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "llm-key", "key": "api-key"}
    assert c["image"] == "ghcr.io/radixserve/radixserve-operator:0.1.0"
    script = c["args"][0]
    assert "/v1/models" in script and "/v1/completions" in script and '"max_tokens": 1' in script
    compile(script, "helm-test", "exec")  # the script is valid Python


def test_helm_test_script_against_a_fake_server(render) -> None:
    """Run the Pod's script against a tiny OpenAI-shaped server on loopback."""
    import json
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            seen.append(self.path)
            self._send({"object": "list", "data": [{"id": "m"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(f"{self.path} {body['model']} {body['max_tokens']}")
            self._send({"choices": [{"text": "!"}], "usage": {"completion_tokens": 1}})

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (c,) = one(render(VALUE_SETS["production"]), "Pod")["spec"]["containers"]
        env = {"BASE_URL": f"http://127.0.0.1:{server.server_port}", "TIMEOUT": "10", "PATH": ""}
        out = subprocess.run(
            [sys.executable, "-c", c["args"][0]],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    assert seen == ["/v1/models", "/v1/completions m 1"]


def _notes(values: dict) -> str:
    with helm.Chart.load(CHART_DIR) as chart:
        return chart.render(values, name="rs", namespace="llm")["radixserve/templates/NOTES.txt"]


@pytest.mark.parametrize("name", ["defaults", "production"])
def test_notes_tell_the_next_commands(name: str) -> None:
    notes = _notes(VALUE_SETS[name])
    assert "helm test rs -n llm --logs" in notes
    assert "kubectl get hpa NAME -n llm" in notes
    if name == "production":
        assert "--set test.inferenceService=NAME" not in notes
        assert "ConfigMap rs-radixserve-adapter-rules" in notes
    else:
        assert "--set test.inferenceService=NAME" in notes
        assert "prometheusAdapter.rules.enabled=true" in notes
