"""The latency histograms on /metrics (what the chart's Grafana dashboard plots): each finished
request is observed exactly once, by a real server over HTTP."""
from __future__ import annotations

import httpx

from tests.server.server_process import API_KEY

HISTOGRAMS = ("radixserve_time_to_first_token_seconds", "radixserve_time_per_output_token_seconds",
              "radixserve_e2e_request_latency_seconds")
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _complete(server, stream: bool) -> None:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    r = httpx.post(f"{server.base}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text


def test_each_finished_request_is_observed_once_in_every_latency_histogram(server) -> None:
    before = server.metrics()
    _complete(server, stream=False)
    _complete(server, stream=True)
    after = server.metrics()
    for name in HISTOGRAMS:
        assert after[f"{name}_count"] - before.get(f"{name}_count", 0) == 2, name
        assert after[f"{name}_sum"] > before.get(f"{name}_sum", 0), name
        # the +Inf bucket counts every observation: the buckets and the count agree
        assert after[f'{name}_bucket{{le="+Inf"}}'] == after[f"{name}_count"], name


def test_a_one_token_request_has_no_time_per_output_token(server) -> None:
    before = server.metrics()
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, "temperature": 0, "ignore_eos": True}
    assert httpx.post(f"{server.base}/v1/completions", json=body, headers=AUTH, timeout=60).status_code == 200
    after = server.metrics()
    assert after["radixserve_e2e_request_latency_seconds_count"] - before["radixserve_e2e_request_latency_seconds_count"] == 1
    assert (after["radixserve_time_per_output_token_seconds_count"]
            == before.get("radixserve_time_per_output_token_seconds_count", 0))


def test_metrics_exports_queue_kv_and_prefix_cache_series(server) -> None:
    """The dashboard's non-latency panels read these; they must be on /metrics from the start."""
    m = server.metrics()
    for name in ("radixserve_waiting", "radixserve_running", "radixserve_kv_pages_used", "radixserve_kv_pages_total",
                 "radixserve_prefix_cache_hit_tokens_total", "radixserve_prefill_tokens_total",
                 "radixserve_generation_tokens_total"):
        assert name in m, name
