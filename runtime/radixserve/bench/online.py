"""`radixserve bench online`: drive a running server with Poisson arrivals over the streaming
completions API and report TTFT, TPOT, ITL and throughput percentiles, like sglang.bench_serving."""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from radixserve.bench.workload import BenchRequest


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str = ""


async def one_request(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest) -> RequestResult:
    body = {"model": model, "prompt": req.input_ids, "max_tokens": req.output_len, "stream": True,
            "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    last, res = start, RequestResult(ok=False)
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                return RequestResult(False, error=f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                    continue
                now = time.perf_counter()
                if res.ttft == 0.0:
                    res.ttft = now - start
                else:
                    res.itls.append(now - last)
                last = now
    except httpx.HTTPError as e:
        return RequestResult(False, error=repr(e))
    res.latency, res.ok = time.perf_counter() - start, True
    return res


async def run_online(base_url: str, model: str, reqs: list[BenchRequest], rate: float,
                     max_concurrency: int, seed: int = 0) -> tuple[list[RequestResult], float]:
    rng = random.Random(seed)
    sem = asyncio.Semaphore(max_concurrency)
    limits = httpx.Limits(max_connections=max_concurrency + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        async def guarded(r: BenchRequest) -> RequestResult:
            async with sem:
                return await one_request(client, f"{base_url}/v1/completions", model, r)

        tasks, start = [], time.perf_counter()
        for r in reqs:
            tasks.append(asyncio.create_task(guarded(r)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


def percentiles(xs: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[int, float]:
    if not xs:
        return {p: float("nan") for p in ps}
    s = sorted(xs)
    return {p: s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] for p in ps}


def report(results: list[RequestResult], duration: float) -> str:
    ok = [r for r in results if r.ok]
    toks = sum(r.output_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    lines = [f"requests: {len(ok)}/{len(results)} ok in {duration:.2f} s; "
             f"throughput {len(ok) / duration:.2f} req/s, {toks / duration:.1f} output tok/s"]
    for name, xs in [("TTFT", [r.ttft for r in ok]), ("TPOT", tpot),
                     ("ITL", [x for r in ok for x in r.itls]), ("E2E", [r.latency for r in ok])]:
        p = percentiles(xs)
        lines.append(f"{name:<5} ms  p50 {p[50] * 1e3:9.2f}  p90 {p[90] * 1e3:9.2f}  p99 {p[99] * 1e3:9.2f}")
    errors = [r.error for r in results if not r.ok]
    if errors:
        lines.append(f"first error: {errors[0]}")
    return "\n".join(lines)
