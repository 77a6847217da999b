"""Mixed prefill and decode batches (on by default, `--disable-mixed-chunk`): greedy tokens still equal
transformers for every architecture; running requests keep emitting while a long prompt is
prefilled (they wait for it without); a mixed batch stays within the prefill token budget."""
from __future__ import annotations

import pytest

from radixserve import LLM, SamplingParams
from radixserve.config import EngineConfig, SchedulerConfig, add_engine_args, configs_from_args
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import (
    drain,
    greedy_reference,
    mixed_batches,
    random_prompts,
    spy_batches,
)

LENGTHS = [1, 7, 33, 129, 200, 64, 300, 16]
MAX_NEW = 12


@pytest.fixture
def batches(monkeypatch) -> list[tuple[list[int], list[bool], bool]]:
    return spy_batches(monkeypatch)


@pytest.mark.parametrize("overlap", [True, False])
def test_mixed_batches_keep_transformers_greedy_tokens(tiny_ckpts, batches, overlap) -> None:
    reference = greedy_reference(tiny_ckpts, LENGTHS, MAX_NEW)
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    for arch, path in tiny_ckpts.items():
        prompts, expected = reference[arch]
        batches.clear()
        # three rows for eight requests: later prompts are prefilled, in chunks of at most 40
        # tokens, while earlier requests decode
        llm = LLM(str(path), dtype="float32", device="cpu", page_size=4, max_prefill_length=40,
                  max_running_requests=3, mixed_chunk=True, overlap=overlap)
        got = [r.token_ids for r in llm.generate(prompts, sp)]
        assert got == expected, f"{arch}: mixed batches changed the greedy tokens"
        assert len(mixed_batches(batches)) >= 5, f"{arch}: too few mixed batches to prove anything"
        assert all(sum(ext) <= 40 for ext, _, decode in batches if not decode)
        llm.scheduler.check_integrity()


def _run_beside_long_prompt(path, mixed: bool, seen) -> tuple[dict[int, list[int]], int, int]:
    """Request 0 decodes; then request 1's 300-token prompt arrives, prefilled 25 tokens per batch.
    Returns both requests' tokens, the tokens request 0 emitted between request 1's arrival and
    its first token, and the number of batches that carried request 1's prompt."""
    s = Scheduler(EngineConfig(model=str(path), dtype="float32", device="cpu"),
                  SchedulerConfig(max_prefill_length=25, max_running_requests=4, mixed_chunk=mixed))
    sp = SamplingParams(max_tokens=60, ignore_eos=True)
    s.add_request(0, [5, 6, 7], sp)
    tokens: dict[int, list[int]] = {0: [], 1: []}
    while len(tokens[0]) < 3:
        for o in s.step():
            tokens[o.uid].append(o.token_id)
    seen.clear()
    s.add_request(1, random_prompts(1, [300], 300, seed=7)[0], sp)
    during = 0
    while not tokens[1]:
        for o in s.step():
            tokens[o.uid].append(o.token_id)
            during += o.uid == 0 and not tokens[1]
    chunks = sum(1 for ext, done, decode in seen if not decode and not all(done))
    for uid, outs in drain(s).items():
        tokens[uid] += [o.token_id for o in outs]
    return tokens, during, chunks


def test_running_requests_keep_emitting_during_a_long_prefill(tiny_ckpts, batches) -> None:
    path = tiny_ckpts["llama"]
    on, during_on, chunks_on = _run_beside_long_prompt(path, True, batches)
    off, during_off, chunks_off = _run_beside_long_prompt(path, False, batches)
    assert on == off and len(on[0]) == len(on[1]) == 60
    # 300 prompt tokens: 12 batches of 25 without mixing, 13 of at most 24 with one decode token
    assert (chunks_off, chunks_on) == (12, 13)
    assert during_on >= chunks_on - 1, "request 0 stalled while request 1 was prefilled"
    assert during_off <= 1, "without mixed batches a prefill batch carries no decode token"


def test_flag_reaches_the_scheduler_config() -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert configs_from_args(p.parse_args([]))[1].mixed_chunk is True  # the default (measured)
    assert configs_from_args(p.parse_args(["--disable-mixed-chunk"]))[1].mixed_chunk is False
    assert configs_from_args(p.parse_args(["--enable-mixed-chunk"]))[1].mixed_chunk is True
