"""The scheduler's retraction and host-tier totals become Prometheus counters (the increase of
each report) and the host tier's size gauges, beside the other scheduler series."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from radixserve.messages import SchedulerStats
from radixserve.server.metrics import ServerMetrics


def samples(m: ServerMetrics) -> dict[str, float]:
    return {s.name: s.value for fam in text_string_to_metric_families(m.render().decode())
            for s in fam.samples}


def test_retraction_and_host_tier_totals_are_counted() -> None:
    m = ServerMetrics()
    first = {"retractions": 2, "retracted_tokens_recomputed": 30, "host_hit_tokens": 64,
             "host_written_tokens": 512, "host_kv_tokens": 400, "host_kv_tokens_total": 4096}
    m.on_stats(SchedulerStats(first, None))
    m.on_stats(SchedulerStats({**first, "retractions": 5, "host_hit_tokens": 100,
                               "host_kv_tokens": 300}, None))
    got = samples(m)
    assert got["radixserve_retractions_total"] == 5
    assert got["radixserve_retracted_tokens_recomputed_total"] == 30
    assert got["radixserve_host_cache_hit_tokens_total"] == 100
    assert got["radixserve_host_cache_written_tokens_total"] == 512
    assert got["radixserve_host_kv_tokens"] == 300 and got["radixserve_host_kv_tokens_total"] == 4096
