"""A multi-tenant shared-prefix workload through the SGLang model gateway (`smg`) in front of real
replicas, one routing policy at a time, each on freshly started replicas (cold caches), with the
prefill work read from every replica's `/metrics`. The test asserts on it; run as a script it
prints the figures of docs/benchmarks.md:

    python -m tests.server.router_bench --policies cache_aware round_robin random
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from radixserve.bench.online import RequestResult, percentiles, run_online
from radixserve.bench.workload import BenchRequest, text_workload
from tests.server.router_process import RouterProcess
from tests.server.server_process import API_KEY, ServerProcess


@dataclass
class ReplicaWork:
    prompt_tokens: int  # of finished requests
    computed: int  # prompt tokens prefilled
    cached: int  # prompt tokens served from the prefix cache
    requests: int


@dataclass
class PolicyRun:
    policy: str
    results: list[RequestResult]
    seconds: float
    replicas: list[ReplicaWork]

    @property
    def computed(self) -> int:
        return sum(r.computed for r in self.replicas)

    @property
    def hit_ratio(self) -> float:
        hit = sum(r.cached for r in self.replicas)
        return hit / (hit + self.computed) if hit + self.computed else 0.0

    def summary(self) -> str:
        ok = [r for r in self.results if r.ok]
        ttft = percentiles([r.ttft for r in ok], (50, 99))
        out = sum(r.output_tokens for r in ok)
        return (f"{self.policy:<12} ok {len(ok)}/{len(self.results)}  prefill computed {self.computed:>7}  "
                f"cache hit {self.hit_ratio:6.1%}  TTFT p50 {ttft[50] * 1e3:8.1f} ms  p99 {ttft[99] * 1e3:8.1f} ms  "
                f"{len(ok) / self.seconds:6.2f} req/s  {out / self.seconds:7.1f} out tok/s  "
                f"requests per replica {[r.requests for r in self.replicas]}")


def _work(m: dict[str, float]) -> ReplicaWork:
    return ReplicaWork(int(m.get("radixserve_prompt_tokens_total", 0)), int(m.get("radixserve_prefill_tokens_total", 0)),
                       int(m.get("radixserve_prefix_cache_hit_tokens_total", 0)),
                       int(sum(v for k, v in m.items() if k.startswith("radixserve_requests_total{"))))


def settled(srv: ServerProcess, timeout: float = 60.0) -> dict[str, float]:
    """`/metrics` once the replica is idle and has sent its scheduler stats since (every 0.25 s):
    the prefill counters come with those stats, after the clients already have their answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = srv.metrics()
        if m["radixserve_running"] == 0 and m["radixserve_waiting"] == 0:
            break
        time.sleep(0.1)
    time.sleep(0.6)
    return srv.metrics()


@contextlib.contextmanager
def replicas(model: Path | None, n: int, logs: Path, *extra: str) -> Iterator[list[ServerProcess]]:
    srvs = [ServerProcess(model, logs / f"replica-{i}.log", "--api-key", API_KEY, "--served-model-name", "tiny",
                          *extra) for i in range(n)]
    try:
        for s in srvs:
            s.wait_ready(timeout=600)  # several replicas load at once
        yield srvs
    finally:
        for s in srvs:
            s.stop()


def route_through(srvs: list[ServerProcess], policy: str, reqs: list[BenchRequest], logs: Path,
                  concurrency: int = 4) -> PolicyRun:
    """`reqs` through a new `policy` router in front of `srvs`; the work they did for them."""
    router = RouterProcess([s.base for s in srvs], policy, logs / f"router-{policy}.log")
    try:
        router.wait_ready()
        before = [_work(settled(s)) for s in srvs]
        results, secs = asyncio.run(run_online(router.base, "tiny", reqs, float("inf"), concurrency,
                                               api_key=API_KEY))
        after = [_work(settled(s)) for s in srvs]
    finally:
        router.stop()
    work = [ReplicaWork(a.prompt_tokens - b.prompt_tokens, a.computed - b.computed, a.cached - b.cached,
                        a.requests - b.requests) for a, b in zip(after, before)]
    return PolicyRun(policy, results, secs, work)


def run_policy(model: Path | None, policy: str, reqs: list[BenchRequest], logs: Path, n_replicas: int = 3,
               concurrency: int = 4, server_args: tuple[str, ...] = ()) -> PolicyRun:
    """`reqs` through a `policy` router in front of `n_replicas` freshly started servers."""
    with replicas(model, n_replicas, logs, *server_args) as srvs:
        return route_through(srvs, policy, reqs, logs, concurrency)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin", "random"])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--system-prompts", type=int, default=8)
    p.add_argument("--system-prompt-words", type=int, default=700)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-kv-tokens", type=int, default=65536)
    a = p.parse_args()
    reqs = text_workload(a.requests, (8, 24), (a.output_len, a.output_len), 0, a.system_prompts,
                         a.system_prompt_words)
    print(f"{a.requests} requests: {a.system_prompts} system prompts of {a.system_prompt_words} words, "
          f"8-24 words of their own, {a.output_len} output tokens; {a.replicas} replicas, concurrency "
          f"{a.concurrency}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for policy in a.policies:
            run = run_policy(Path(a.model) if a.model else None, policy, reqs, Path(tmp), a.replicas,
                             a.concurrency, ("--max-kv-tokens", str(a.max_kv_tokens)))
            print(run.summary(), flush=True)


if __name__ == "__main__":
    main()
