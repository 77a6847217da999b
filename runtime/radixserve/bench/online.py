"""`radixserve bench online`: drive a running server with Poisson arrivals over the streaming
completions API and report TTFT, TPOT, ITL and throughput percentiles, like sglang.bench_serving.

What is timed: a request's clock starts when it is sent (after the concurrency limit lets it go).
Every streamed chunk with a choice is one output of the server's scheduler (radixserve and sglang
send one per output, even when its text is empty because a character is still incomplete), so
TTFT is the time to the first such chunk and ITL the gap between successive ones; text is not
inspected. Token counts come from the final usage chunk (`stream_options.include_usage`), never
from chunks or text. A request that gets an HTTP error, an error event, an aborted finish, a
stream cut short or no usage counts as failed and is reported."""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from radixserve.bench.workload import BenchRequest


@dataclass
class RequestResult:
    scheduled_at: float  # seconds after the benchmark's start the arrival process drew for it
    requested_tokens: int
    ok: bool = False
    sent_at: float = 0.0  # when it was actually sent (later than scheduled_at under max_concurrency)
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    chunks: int = 0
    prompt_tokens: int = 0  # from usage
    output_tokens: int = 0  # from usage
    error: str = ""


def arrival_offsets(n: int, rate: float, seed: int = 0) -> list[float]:
    """Send times of a Poisson process of `rate` requests/s, the first at 0 (all 0 for `inf`)."""
    if not rate > 0:
        raise ValueError(f"request_rate must be > 0 (or inf), got {rate}")
    if rate == float("inf"):
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def _error_text(body: bytes) -> str:
    try:
        err = json.loads(body)["error"]
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, KeyError, TypeError):
        return body[:300].decode(errors="replace")


async def _stream_into(res: RequestResult, client: httpx.AsyncClient, url: str, body: dict,
                       start: float) -> None:
    """Fill `res` from one streamed completion; raises RuntimeError with the reason it failed."""
    usage, done, last = None, False, start
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {_error_text(await r.aread())}")
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                raise RuntimeError(f"error event: {_error_text(data.encode())}")
            usage = chunk.get("usage") or usage
            if not chunk.get("choices"):
                continue
            if chunk["choices"][0].get("finish_reason") == "abort":
                raise RuntimeError("the server aborted the request")
            now = time.perf_counter()
            if res.chunks == 0:
                res.ttft = now - start
            else:
                res.itls.append(now - last)
            last, res.chunks = now, res.chunks + 1
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    if usage is None:
        raise RuntimeError("the stream carried no usage (stream_options.include_usage ignored?)")
    if res.chunks == 0:
        raise RuntimeError("the stream carried no tokens")
    res.prompt_tokens, res.output_tokens = usage["prompt_tokens"], usage["completion_tokens"]


async def one_request(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest,
                      scheduled_at: float, t0: float) -> RequestResult:
    prompt = req.text if req.text is not None else req.input_ids
    body = {"model": model, "prompt": prompt, "max_tokens": req.output_len, "stream": True,
            "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
    res = RequestResult(scheduled_at, req.output_len)
    start = time.perf_counter()
    res.sent_at = start - t0
    try:
        await _stream_into(res, client, url, body, start)
    except Exception as e:  # noqa: BLE001 -- a benchmark records any failure and goes on
        res.error = str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"
        return res
    res.latency, res.ok = time.perf_counter() - start, True
    return res


async def run_online(base_url: str, model: str, reqs: list[BenchRequest], rate: float,
                     max_concurrency: int, seed: int = 0, api_key: str | None = None
                     ) -> tuple[list[RequestResult], float]:
    """Send `reqs` at Poisson arrivals; (one result per request, in order; wall seconds)."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    offsets = arrival_offsets(len(reqs), rate, seed)
    sem = asyncio.Semaphore(max_concurrency)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max_concurrency + 8)
    url = f"{base_url.rstrip('/')}/v1/completions"
    timeout = httpx.Timeout(600.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        tasks, t0 = [], time.perf_counter()

        async def guarded(r: BenchRequest, at: float) -> RequestResult:
            async with sem:
                return await one_request(client, url, model, r, at, t0)

        for r, at in zip(reqs, offsets):
            while (delay := t0 + at - time.perf_counter()) > 0:  # a timer may fire a hair early
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(guarded(r, at)))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - t0


def percentiles(xs: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[int, float]:
    """Nearest-rank percentiles (nan for no samples)."""
    if not xs:
        return {p: float("nan") for p in ps}
    s = sorted(xs)
    return {p: s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))] for p in ps}


def report(results: list[RequestResult], duration: float) -> str:
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    n_in, n_out = sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok)
    asked = sum(r.requested_tokens for r in ok)
    lines = [
        f"successful requests:     {len(ok)}/{len(results)} ({len(failed)} failed) in {duration:.2f} s",
        f"request throughput:      {len(ok) / duration:10.2f} req/s",
        f"input token throughput:  {n_in / duration:10.1f} tok/s  ({n_in} prompt tokens, from usage)",
        (f"output token throughput: {n_out / duration:10.1f} tok/s  ({n_out} output tokens, "
         f"from usage; {asked} requested)"),
    ]
    if n_out != asked:
        lines.append("WARNING: output tokens differ from those requested (server ignores ignore_eos?)")
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    lines.append(f"{'ms':<5} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9}")
    for name, xs in [("TTFT", [r.ttft for r in ok]), ("TPOT", tpot),
                     ("ITL", [x for r in ok for x in r.itls]), ("E2E", [r.latency for r in ok])]:
        p, mean = percentiles(xs), statistics.fmean(xs) if xs else float("nan")
        lines.append(f"{name:<5} " + " ".join(f"{v * 1e3:9.2f}" for v in (mean, p[50], p[90], p[99])))
    waits = [r.sent_at - r.scheduled_at for r in results]
    if any(w > 1e-3 for w in waits):  # arrivals held back by --max-concurrency
        p = percentiles(waits)
        lines.append(f"client queue (arrival to send, --max-concurrency): mean "
                     f"{statistics.fmean(waits) * 1e3:.2f} ms, p99 {p[99] * 1e3:.2f} ms")
    for err, count in Counter(r.error for r in failed).most_common(5):
        lines.append(f"failed x{count}: {err}")
    return "\n".join(lines)
