"""The load signals under SGLang's metric names, beside our own in the same registry, so a gateway
configured for SGLang engines reads this server: the Gateway API Inference Extension's endpoint
picker (engine type `sglang`) reads `sglang:num_queue_reqs`, `sglang:num_running_reqs`,
`sglang:token_usage` and the KV geometry (`sglang:cache_config_info{page_size,num_pages}`, and the
separate `sglang:page_size` / `sglang:num_pages` gauges newer pickers read). The values come from
the same scheduler stats as `radixserve_*`."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SGLangMetrics:
    def __init__(self, r: CollectorRegistry) -> None:
        self.queue = Gauge("sglang:num_queue_reqs", "Requests waiting for admission", registry=r)
        self.running = Gauge("sglang:num_running_reqs", "Requests in the running batch", registry=r)
        # NOTE: as SGLang's, prefix-cache pages that could be evicted count as free
        self.token_usage = Gauge("sglang:token_usage", "Share of the KV pool held by running requests (0..1)", registry=r)
        self.used_tokens = Gauge("sglang:num_used_tokens", "KV tokens held by running requests", registry=r)
        self.max_tokens = Gauge("sglang:max_total_num_tokens", "KV pool capacity in tokens", registry=r)
        self.page_size = Gauge("sglang:page_size", "Tokens per KV page", registry=r)
        self.num_pages = Gauge("sglang:num_pages", "KV pages in the pool", registry=r)
        self.cache_info = Gauge("sglang:cache_config_info", "KV cache geometry in the labels; the value is 1",
                                ["page_size", "num_pages"], registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Tokens generated", registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens", "Prompt tokens served from the prefix cache", registry=r)
        self.spec_accept_length = Gauge("sglang:spec_accept_length", "Speculative decoding: tokens a "
                                        "verification step produced on average (kept drafts + 1)", registry=r)
        self._geometry: tuple[int, int] | None = None

    def on_stats(self, stats: dict[str, int], new_hit_tokens: int) -> None:
        self.queue.set(stats.get("waiting", 0))
        self.running.set(stats.get("running", 0))
        total, pages = stats.get("kv_tokens_total", 0), stats.get("kv_pages_total", 0)
        if total:
            self.token_usage.set(stats.get("kv_tokens_in_use", 0) / total)
        self.used_tokens.set(stats.get("kv_tokens_in_use", 0))
        if total and pages and self._geometry != (total, pages):
            self._geometry = (total, pages)
            self.max_tokens.set(total)
            self.page_size.set(total // pages)
            self.num_pages.set(pages)
            self.cache_info.clear()
            self.cache_info.labels(page_size=str(total // pages), num_pages=str(pages)).set(1)
        if new_hit_tokens > 0:
            self.cached_tokens.inc(new_hit_tokens)

    def on_speculation(self, accepted: int, steps: int) -> None:
        """The scheduler's totals so far (none without speculation: the gauge stays 0)."""
        if steps:
            self.spec_accept_length.set((accepted + steps) / steps)

    def on_finished(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
