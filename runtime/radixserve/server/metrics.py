"""Prometheus metrics in a private registry per server. The scheduler's gauges arrive through its
periodic `SchedulerStats` messages."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixserve.messages import SchedulerStats
from radixserve.server.lora_metrics import LoRAMetrics
from radixserve.server.sglang_metrics import SGLangMetrics

# NOTE: LLM latencies span decades: a decode step is milliseconds, a long prefill behind a queue is
# tens of seconds and a long generation minutes, so each histogram gets buckets over its own range
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 240.0, 480.0)
_GAUGES = {
    "running": "Requests in the running batch",
    "waiting": "Requests waiting for admission",
    "kv_pages_used": "KV cache pages in use (including pages held only by the prefix cache)",
    "kv_pages_total": "KV cache pages in the pool",
    "evictable_tokens": "Prefix-cache tokens that can be evicted",
    "protected_tokens": "Prefix-cache tokens locked by running requests",
    "host_kv_tokens": "Tokens the host KV tier holds (0 without one)",
    "host_kv_tokens_total": "Host KV tier capacity in tokens (0 without one)",
}


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("radixserve_requests", "Finished requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("radixserve_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("radixserve_generation_tokens", "Tokens generated", registry=r)
        # scheduler-side counters: the scheduler reports running totals, these count the increase
        self.counters = {
            "prefix_hit_tokens": Counter("radixserve_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache", registry=r),
            "prefill_tokens": Counter("radixserve_prefill_tokens", "Prompt tokens computed by prefill", registry=r),
            "aborted_waiting": Counter("radixserve_aborted_waiting_requests", "Requests aborted while waiting, before any prefill", registry=r),
            "spec_draft_tokens": Counter("radixserve_spec_draft_tokens", "Speculative decoding: tokens drafted", registry=r),
            "spec_accepted_tokens": Counter("radixserve_spec_accepted_tokens", "Speculative decoding: drafted tokens the target kept", registry=r),
            "spec_verify_steps": Counter("radixserve_spec_verify_steps", "Speculative decoding: a request's steps that verified drafts", registry=r),
            "retractions": Counter("radixserve_retractions", "Running requests retracted for lack of KV (optimistic admission); each is requeued and resumed", registry=r),
            "retracted_tokens_recomputed": Counter("radixserve_retracted_tokens_recomputed", "KV tokens retracted requests had computed and computed again when re-admitted", registry=r),
            "host_hit_tokens": Counter("radixserve_host_cache_hit_tokens", "Prompt tokens loaded back from the host KV tier", registry=r),
            "host_written_tokens": Counter("radixserve_host_cache_written_tokens", "KV tokens copied to the host KV tier", registry=r),
        }
        self.gauges = {k: Gauge(f"radixserve_{k}", doc, registry=r) for k, doc in _GAUGES.items()}
        # NOTE: the autoscaling signal: pages the prefix cache keeps but could evict count as free
        # (as vLLM's KV usage), else a server that once filled its cache would read full forever
        self.kv_usage = Gauge("radixserve_kv_cache_usage_ratio", "Share of the KV pool held or locked by "
                              "running requests (0..1); evictable prefix-cache pages count as free", registry=r)
        self.integrity = Gauge("radixserve_kv_integrity_ok", "1 when the idle scheduler's KV/radix check passed, 0 if it failed, -1 while busy", registry=r)
        self.ttft = Histogram("radixserve_time_to_first_token_seconds", "Time from submission to a request's first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("radixserve_inter_token_latency_seconds", "Time between tokens of a request", buckets=_TOKEN_BUCKETS, registry=r)
        self.tpot = Histogram("radixserve_time_per_output_token_seconds",
                              "Per finished request of at least 2 tokens: (end-to-end - first token) / (tokens - 1)",
                              buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("radixserve_e2e_request_latency_seconds", "Time from submission to a request's last token",
                             buckets=_E2E_BUCKETS, registry=r)
        self._last: dict[str, int] = dict.fromkeys(self.counters, 0)
        self.integrity.set(-1)
        self.sglang = SGLangMetrics(r)
        self.lora = LoRAMetrics(r)
        self.last_stats: dict[str, int] = {}  # the scheduler's latest, for the load endpoints

    def on_stats(self, msg: SchedulerStats) -> None:
        self.last_stats = msg.stats
        if msg.stats.get("lora_slots"):
            self.lora.on_stats(msg.stats["lora_slots"], msg.lora)
        self.sglang.on_stats(msg.stats, msg.stats.get("prefix_hit_tokens", 0) - self._last["prefix_hit_tokens"])
        for key, gauge in self.gauges.items():
            if key in msg.stats:
                gauge.set(msg.stats[key])
        if msg.stats.get("kv_tokens_total"):
            self.kv_usage.set(msg.stats["kv_tokens_in_use"] / msg.stats["kv_tokens_total"])
        for key, counter in self.counters.items():
            total = msg.stats.get(key, self._last[key])
            if total > self._last[key]:
                counter.inc(total - self._last[key])
            self._last[key] = total
        self.integrity.set(-1 if msg.integrity_ok is None else int(msg.integrity_ok))
        self.sglang.on_speculation(msg.stats.get("spec_accepted_tokens", 0),
                                   msg.stats.get("spec_verify_steps", 0))

    def on_finished(self, outcome: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.requests.labels(outcome=outcome).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.sglang.on_finished(prompt_tokens, completion_tokens)

    def on_latency(self, e2e_s: float, ttft_s: float | None, completion_tokens: int) -> None:
        """Once per finished (sub-)request. TPOT leaves out the first token: that one is prefill's."""
        self.e2e.observe(e2e_s)
        if ttft_s is not None and completion_tokens >= 2:
            self.tpot.observe((e2e_s - ttft_s) / (completion_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
