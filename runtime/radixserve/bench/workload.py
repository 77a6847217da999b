"""Benchmark requests: random token ids with lengths drawn uniformly, reproducible by seed."""
from __future__ import annotations

import random
from typing import NamedTuple


class BenchRequest(NamedTuple):
    input_ids: list[int]
    output_len: int


def random_workload(
    num: int, input_range: tuple[int, int], output_range: tuple[int, int], vocab_size: int,
    seed: int = 0,
) -> list[BenchRequest]:
    """mini-sglang's / nano-vllm's offline workload: lengths uniform in the closed ranges. Token
    ids avoid the top of the vocabulary, where special tokens live."""
    rng = random.Random(seed)
    hi = max(2, min(vocab_size, 32000) - 1)
    out = []
    for _ in range(num):
        n_in = rng.randint(*input_range)
        out.append(BenchRequest([rng.randint(1, hi) for _ in range(n_in)], rng.randint(*output_range)))
    return out


def shared_prefix_workload(
    num: int, prefix_len: int, suffix_range: tuple[int, int], output_range: tuple[int, int],
    vocab_size: int, seed: int = 0, prefix_seed: int = 0,
) -> list[BenchRequest]:
    """Requests that all start with one `prefix_len`-token system prompt (drawn from
    `prefix_seed`) followed by their own random suffix: a prefix cache computes the system prompt
    once. Two calls with the same `prefix_seed` and different `seed`s share the prompt only."""
    prefix = random_workload(1, (prefix_len, prefix_len), (1, 1), vocab_size, prefix_seed)[0]
    tails = random_workload(num, suffix_range, output_range, vocab_size, seed + 1)
    return [BenchRequest(prefix.input_ids + t.input_ids, t.output_len) for t in tails]
