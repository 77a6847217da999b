"""`radixserve bench offline --shared-prefix N`: requests that share an N-token system prompt, each
with its own suffix, timed with the radix cache and with the naive one in one command, with the
prompt tokens each had to compute.

The warm-up requests share the system prompt too (their suffixes are their own), as a server's
earlier traffic would, so the timed requests find it cached. With `--warmup 0` the first request
computes it and the others wait for that prefill, which puts it in the radix cache at once
(`scheduler/prefill.py`), so they compute only their suffixes too.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from radixserve.bench.offline import bench_config
from radixserve.bench.workload import shared_prefix_workload
from radixserve.config import CACHE_CHOICES, EngineConfig, SchedulerConfig


class PrefixRun(NamedTuple):
    cache: str
    tok_s: float
    prefill_tokens: int  # prompt tokens computed in the timed region (the rest came from cache)
    desc: str


def run_shared_prefix(
    eng: EngineConfig, sch: SchedulerConfig, prefix_len: int, num: int,
    suffix_range: tuple[int, int], output_range: tuple[int, int], vocab_size: int, warmup: int,
) -> list[PrefixRun]:
    """The workload under `--cache radix` then `--cache naive`, each line printed as it lands."""
    reqs = shared_prefix_workload(num, prefix_len, suffix_range, output_range, vocab_size, seed=0)
    warm = shared_prefix_workload(warmup, prefix_len, suffix_range, output_range, vocab_size,
                                  seed=1)
    prompt_tokens = sum(len(r.input_ids) for r in reqs)
    print(f"workload: {num} requests sharing a {prefix_len}-token system prompt, own suffixes of "
          f"{suffix_range} tokens, output {output_range}, seed 0, ignore_eos ({prompt_tokens} "
          f"prompt tokens); {warmup} warm-up requests with the same system prompt", flush=True)
    runs: list[PrefixRun] = []
    for cache in CACHE_CHOICES:  # the radix cache, then the naive one
        stats: dict[str, int] = {}
        tps, desc = bench_config(eng, dataclasses.replace(sch, cache=cache), reqs, warmup,
                                 warmup_reqs=warm, stats=stats)
        runs.append(PrefixRun(cache, tps, stats["prefill_tokens"], desc))
        print(f"{'radixserve cache ' + cache:<28} {tps:>10.1f} output tok/s   prefill tokens "
              f"computed {stats['prefill_tokens']:>8}   [{desc}]", flush=True)
    radix, naive = runs
    print(f"{'ratio radix/naive':<28} {radix.tok_s / naive.tok_s:>10.3f}x throughput, "
          f"{radix.prefill_tokens / max(naive.prefill_tokens, 1):.4f}x prefill tokens", flush=True)
    return runs
