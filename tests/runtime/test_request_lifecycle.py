"""A request's life has one owner: admission checks in one function (`check_request`), aborts in
either order with the request (the ledger), and overlap as a config field. Every caller goes
through `Scheduler.add_request`, so `LLM` refuses what the server refuses, with the same words."""
from __future__ import annotations

import argparse

import pytest

from radixserve import LLM, SamplingParams
from radixserve.config import SchedulerConfig, add_engine_args, configs_from_args
from radixserve.scheduler.admission import AdmissionError, Limits, check_request
from radixserve.scheduler.ledger import RequestLedger

LIMITS = Limits(max_seq_len=64, kv_capacity=48, vocab_size=100)


@pytest.mark.parametrize(("ids", "params", "param", "code", "words"), [
    ([], SamplingParams(), "prompt", None, "the prompt is empty"),
    ([5, 100], SamplingParams(), "input_ids", None, "token ids must be in [0, 100)"),
    ([-1, 5], SamplingParams(), "input_ids", None, "token ids must be in [0, 100)"),
    ([99, 5, 0, 100, 3], SamplingParams(), "input_ids", None, "token ids must be in [0, 100)"),
    ([5] * 60, SamplingParams(max_tokens=8), "max_tokens", "context_length_exceeded",
     "maximum context length is 64 tokens, but the request needs 68 tokens"),
    ([5] * 64, SamplingParams(max_tokens=1), "prompt", "context_length_exceeded",
     "65 tokens (64 in the prompt"),
    ([5] * 40, SamplingParams(max_tokens=10), "max_tokens", None, "KV cache capacity 48"),
])
def test_check_request_refuses_naming_the_field(ids, params, param, code, words) -> None:
    with pytest.raises(AdmissionError) as e:
        check_request(ids, params, LIMITS)
    assert (e.value.param, e.value.code, e.value.status) == (param, code, 400)
    assert words in e.value.message and isinstance(e.value, ValueError)


def test_auto_max_tokens_fills_the_room_left_without_touching_the_callers_params() -> None:
    params = SamplingParams(max_tokens=1000)
    got = check_request([5] * 10, params, LIMITS, auto_max_tokens=True)
    assert got.max_tokens == 48 - 10 and params.max_tokens == 1000  # the KV cache is the smaller
    assert check_request([5] * 10, SamplingParams(max_tokens=3), LIMITS, True).max_tokens == 3


def test_ledger_forgets_old_tombstones() -> None:
    ledger = RequestLedger(memory=2, ttl_s=0.0)
    ledger.tombstone(1)
    ledger.tombstone(2)  # expires 1 (older than the TTL)
    assert not ledger.take_tombstone(1) and ledger.take_tombstone(2)
    for uid in (1, 2, 3):
        ledger.finished(uid)
    assert not ledger.is_finished(1) and ledger.is_finished(3)


def test_a_flood_of_aborts_keeps_each_tombstone_cheap() -> None:
    """Clients that leave before their prompts reach the scheduler leave a tombstone each; the
    scheduler thread files them, so each must cost O(1) however many are alive (a scan of every
    live one made 200,000 cost minutes of the scheduler's time)."""
    import time

    ledger = RequestLedger(ttl_s=3600.0)
    t0 = time.monotonic()
    for uid in range(200_000):
        ledger.tombstone(uid)
    assert time.monotonic() - t0 < 30, "filing tombstones scans the live ones"
    assert len(ledger) == 200_000 and ledger.take_tombstone(0) and ledger.take_tombstone(199_999)


def test_tombstones_expire_oldest_first() -> None:
    ledger = RequestLedger(ttl_s=3600.0)
    for uid in (1, 2, 3):
        ledger.tombstone(uid)
    ledger.tombstone(1)  # aborted again: it is now the youngest
    ledger.ttl_s = -1.0  # everything filed before now has expired
    ledger.tombstone(4)
    assert len(ledger) == 1 and ledger.take_tombstone(4)


@pytest.fixture(scope="module")
def llm(tiny_ckpts):
    return LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu", max_kv_tokens=2048)


def test_abort_before_arrival_drops_the_request(llm) -> None:
    s = llm.scheduler
    assert s.abort(10**9) is False  # not here yet: remembered
    assert s.add_request(10**9, [5, 6, 7], SamplingParams(max_tokens=4)) is None
    assert not s.has_work and 10**9 not in s.reqs
    assert s.add_request(10**9, [5, 6, 7], SamplingParams(max_tokens=4)) is not None  # reused
    with pytest.raises(AdmissionError, match="already queued"):
        s.add_request(10**9, [5, 6, 7], SamplingParams(max_tokens=4))
    assert s.abort(10**9) is True and not s.has_work


def test_abort_after_finish_is_a_no_op_not_a_tombstone(llm) -> None:
    s = llm.scheduler
    uid = 10**9 + 1
    assert s.add_request(uid, [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))
    while s.has_work:
        s.step()
    tombstones = len(s.ledger)
    assert s.abort(uid) is False and len(s.ledger) == tombstones


def test_llm_refuses_what_the_server_refuses_in_its_words(llm) -> None:
    limit = llm.scheduler.max_seq_len
    with pytest.raises(ValueError, match=rf"^prompt 1: This model's maximum context length is "
                                         rf"{limit} tokens"):
        llm.generate([[5, 6], [5] * limit], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"^prompt 0: input_ids: the prompt is empty"):
        llm.generate([""], SamplingParams(max_tokens=2))
    assert not llm.scheduler.has_work and llm.scheduler.stats()["running"] == 0
    llm.scheduler.check_integrity()


def test_overlap_is_a_config_field_read_at_construction(monkeypatch) -> None:
    monkeypatch.delenv("RADIXSERVE_DISABLE_OVERLAP", raising=False)
    assert SchedulerConfig().overlap is True
    monkeypatch.setenv("RADIXSERVE_DISABLE_OVERLAP", "1")  # after import: still seen
    assert SchedulerConfig().overlap is False
    assert SchedulerConfig(overlap=True).overlap is True
    monkeypatch.delenv("RADIXSERVE_DISABLE_OVERLAP")
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert configs_from_args(p.parse_args([]))[1].overlap is True
    assert configs_from_args(p.parse_args(["--disable-overlap"]))[1].overlap is False


def test_llm_takes_overlap_and_gives_the_same_tokens(tiny_ckpts, llm) -> None:
    prompts = [[5, 6, 7], [9, 8, 7, 6, 5], [11] * 20]
    sp = SamplingParams(max_tokens=9, ignore_eos=True)
    off = LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu", max_kv_tokens=2048,
              overlap=False)
    assert off.scheduler.overlap is False and llm.scheduler.overlap is True
    assert ([r.token_ids for r in off.generate(prompts, sp)]
            == [r.token_ids for r in llm.generate(prompts, sp)])


def test_context_length_caps_what_is_admitted_and_the_page_table(tiny_ckpts) -> None:
    """`context_length` (the CLI's --context-length / --max-model-len) below the model's 1,024:
    a request past it is refused in the same words, one within it runs to its length."""
    with pytest.raises(ValueError, match="context_length must be at least 2, got 1"):
        LLM(str(tiny_ckpts["llama"]), device="cpu", context_length=1)
    with pytest.raises(ValueError, match=r"context_length 4096 is longer than the model's 1024"):
        LLM(str(tiny_ckpts["llama"]), device="cpu", context_length=4096)
    llm = LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu", context_length=48,
              page_size=16, max_kv_tokens=2048)
    s = llm.scheduler
    assert s.max_seq_len == 48 and s.engine.table.page_table.shape[1] == 48
    with pytest.raises(ValueError, match=r"maximum context length is 48 tokens, but the request needs 50"):
        llm.generate([[5] * 40], SamplingParams(max_tokens=10))
    (out,) = llm.generate([[5] * 40], SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(out.token_ids) == 8
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert configs_from_args(p.parse_args(["--max-model-len", "48"]))[0].context_length == 48
    assert configs_from_args(p.parse_args(["--context-length", "48"]))[0].context_length == 48
