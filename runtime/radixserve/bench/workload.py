"""Benchmark requests: random token ids with lengths drawn uniformly, reproducible by seed; or
text, for a front end that takes only text prompts (the SGLang model gateway refuses token ids)."""
from __future__ import annotations

import random
from typing import NamedTuple


class BenchRequest(NamedTuple):
    input_ids: list[int]
    output_len: int
    text: str | None = None  # sent as the prompt instead of `input_ids` when set
    lora: str | None = None  # the LoRA adapter it runs with (`bench/lora.py`)


# common English words, each one token of most tokenizers
_WORDS = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
    "place", "case", "week", "company", "system", "program", "question", "work", "government",
    "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
    "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue",
    "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "name", "team", "minute", "idea", "body",
)


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


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def text_workload(
    num: int, input_range: tuple[int, int], output_range: tuple[int, int], seed: int = 0,
    num_prefixes: int = 0, prefix_words: int = 0,
) -> list[BenchRequest]:
    """Text prompts of common words (`input_range` counts words; the server's usage counts the
    tokens). With `num_prefixes`, a multi-tenant workload: each request starts with one of that
    many `prefix_words`-word system prompts, drawn at random, then its own words."""
    rng = random.Random(seed)
    prefixes = [_words(random.Random(f"{seed}-prefix-{i}"), prefix_words) + "\n" for i in range(num_prefixes)]
    out = []
    for _ in range(num):
        head = rng.choice(prefixes) if prefixes else ""
        out.append(BenchRequest([], rng.randint(*output_range), head + _words(rng, rng.randint(*input_range))))
    return out
