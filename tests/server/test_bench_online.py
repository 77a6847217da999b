"""`radixserve bench online` against a real server (tiny random llama on CPU, real processes):
what it counts and times, its Poisson schedule, and how it reports failures. No timing thresholds."""
from __future__ import annotations

import asyncio
import itertools
import re
import statistics
import subprocess
import sys
import time

import pytest

from radixserve.bench.online import arrival_offsets, report, run_online
from radixserve.bench.workload import BenchRequest, random_workload, text_workload
from radixserve.cli import main
from tests.server.server_process import API_KEY, free_port

VOCAB = 384  # the tiny checkpoint's
N = 8


def _workload(seed: int = 0) -> list[BenchRequest]:
    return random_workload(N, (4, 24), (2, 10), VOCAB, seed)


def _run(server, reqs: list[BenchRequest], rate: float, concurrency: int = 64, model: str = "tiny",
         seed: int = 0):
    return asyncio.run(run_online(server.base, model, reqs, rate, concurrency, seed, API_KEY))


def _check_measurements(results, reqs: list[BenchRequest]) -> None:
    assert [r.error for r in results] == [""] * len(reqs) and all(r.ok for r in results)
    assert sum(r.output_tokens for r in results) == sum(q.output_len for q in reqs)  # from usage
    for r, q in zip(results, reqs):
        assert r.output_tokens == r.requested_tokens == q.output_len
        assert r.prompt_tokens == len(q.input_ids)  # token-array prompts go in as given
        assert 0 < r.ttft <= r.latency
        # one chunk per generated token, empty-text ones included; an ITL between each pair
        assert r.chunks == q.output_len and len(r.itls) == q.output_len - 1


def test_arrival_offsets_are_a_poisson_process_of_the_rate() -> None:
    offsets = arrival_offsets(4001, 5.0, seed=3)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0 and all(g > 0 for g in gaps)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 5.0, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.05)  # exponential: CV 1
    assert arrival_offsets(4001, 5.0, seed=3) == offsets and arrival_offsets(4001, 5.0, seed=4) != offsets
    assert arrival_offsets(5, float("inf")) == [0.0] * 5
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="request_rate"):
            arrival_offsets(3, bad)


def test_finite_rate_counts_tokens_from_usage_and_keeps_the_drawn_schedule(server) -> None:
    reqs = _workload()
    results, duration = _run(server, reqs, rate=20.0, seed=5)
    _check_measurements(results, reqs)
    drawn = arrival_offsets(N, 20.0, seed=5)
    assert [r.scheduled_at for r in results] == drawn
    assert all(r.sent_at >= at for r, at in zip(results, drawn))  # never before its arrival
    assert results[-1].sent_at >= drawn[-1] > 0  # the last starts no earlier than the sum of gaps
    assert duration >= max(r.sent_at + r.latency for r in results)


def test_infinite_rate_sends_at_once_within_the_concurrency_limit(server) -> None:
    reqs = _workload(seed=1)
    results, _ = _run(server, reqs, rate=float("inf"), concurrency=2)
    _check_measurements(results, reqs)
    assert all(r.scheduled_at == 0.0 for r in results)
    spans = [(r.sent_at, r.sent_at + r.latency) for r in results]
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most <= 2


def test_failed_requests_are_reported_not_dropped(server) -> None:
    good = BenchRequest([11, 12, 13], 3)
    out_of_vocab = BenchRequest([11, VOCAB + 1000], 3)
    results, duration = _run(server, [good, out_of_vocab, good], rate=float("inf"))
    assert [r.ok for r in results] == [True, False, True]
    assert "HTTP 400" in results[1].error and "input_ids" in results[1].error
    text = report(results, duration)
    assert "2/3 (1 failed)" in text and "failed x1: HTTP 400" in text
    assert "(6 output tokens, from usage; 6 requested)" in text  # failures add no tokens

    results, _ = _run(server, [good, good], rate=float("inf"), model="no-such-model")
    assert not any(r.ok for r in results)
    assert all(r.error.startswith("HTTP 404") and "no-such-model" in r.error for r in results)


def test_cli_prints_every_metric(server, capsys) -> None:
    args = ["bench", "online", "--base-url", server.base, "--api-key", API_KEY, "--num-prompts", str(N),
            "--input-len", "4", "24", "--output-len", "2", "10", "--vocab-size", str(VOCAB),
            "--request-rate", "50", "inf", "--seed", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # one run per rate, the same requests each time
    assert [m.group(1) for m in re.finditer(r"rate (\S+)/s", out)] == ["50.0", "inf"]
    assert out.count(f"{N}/{N} (0 failed)") == 2
    out = out[out.index("rate inf/s"):]
    asked = sum(q.output_len for q in random_workload(N, (4, 24), (2, 10), VOCAB, 2))
    assert f"{N}/{N} (0 failed)" in out and f"({asked} output tokens, from usage; {asked} requested)" in out
    for label in ("request throughput:", "input token throughput:", "output token throughput:"):
        assert re.search(rf"{label}\s+\d+\.\d+ (req|tok)/s", out), label
    assert re.search(r"ms\s+mean\s+p50\s+p90\s+p99", out)
    for metric in ("TTFT", "TPOT", "ITL", "E2E"):
        row = re.search(rf"^{metric}\s+(.+)$", out, re.MULTILINE)
        assert row and len([float(x) for x in row.group(1).split()]) == 4, metric
    assert "nan" not in out and "WARNING" not in out


def _cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "radixserve", "bench", "online", *args, "--num-prompts", "2"]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)


def test_cli_exits_nonzero_with_a_clear_message(server) -> None:
    bad_model = _cli("--base-url", server.base, "--api-key", API_KEY, "--served-model", "no-such-model")
    assert bad_model.returncode != 0
    assert "does not serve model 'no-such-model' (it serves: tiny)" in bad_model.stderr
    no_key = _cli("--base-url", server.base, "--api-key", "wrong")
    assert no_key.returncode != 0 and "HTTP 401" in no_key.stderr
    url = f"http://127.0.0.1:{free_port()}"
    unreachable = _cli("--base-url", url)
    assert unreachable.returncode != 0 and f"cannot reach the server at {url}" in unreachable.stderr


def test_text_prompts_of_shared_system_prompts_hit_the_prefix_cache(server, tiny_tokenizer) -> None:
    """The text workload (what a router that refuses token ids gets): each request after its
    tenant's first finds the tenant's system prompt in the radix cache (sent one at a time)."""
    reqs = text_workload(6, (2, 4), (2, 2), seed=3, num_prefixes=2, prefix_words=30)
    heads = {r.text.split("\n")[0] + "\n" for r in reqs}
    assert len(heads) == 2 and all(r.text.count("\n") == 1 and not r.input_ids for r in reqs)
    head_tokens = min(len(tiny_tokenizer(h, add_special_tokens=False).input_ids) for h in heads)
    before = server.metrics()["radixserve_prefix_cache_hit_tokens_total"]
    results, _ = _run(server, reqs, rate=float("inf"), concurrency=1)
    assert all(r.ok and r.output_tokens == 2 for r in results), [r.error for r in results]
    for r, q in zip(results, reqs):  # the server tokenized the text: usage counts its tokens
        assert r.prompt_tokens == len(tiny_tokenizer(q.text).input_ids)
    time.sleep(0.6)  # the hit counter comes with the scheduler's next stats (every 0.25 s)
    hits = server.metrics()["radixserve_prefix_cache_hit_tokens_total"] - before
    assert hits >= (len(reqs) - len(heads)) * (head_tokens - 1)


def test_cli_sends_shared_prefix_text_prompts(server, capsys) -> None:
    args = ["bench", "online", "--base-url", server.base, "--api-key", API_KEY, "--num-prompts", "4",
            "--input-len", "2", "4", "--output-len", "2", "2", "--shared-prefix", "2", "20"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "text prompts (2 system prompts of 20 words, then) input (2, 4)" in out and "4/4 (0 failed)" in out
