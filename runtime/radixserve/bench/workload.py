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
