"""Tensor parallelism on CPU (gloo): TP=2 gives the TP=1 tokens for every architecture; a late
rank still gets its first request; a dead rank fails the leader instead of hanging it."""
from __future__ import annotations

import multiprocessing
import time

import pytest

from radixserve import LLM, SamplingParams
from tests.runtime.helpers import fast_corners, random_prompts

SP = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPTS = random_prompts(6, [1, 9, 40, 77, 130, 16], 300, seed=11)


def tokens(llm: LLM) -> list[list[int]]:
    return [r.token_ids for r in llm.generate(PROMPTS, SP)]


def prompt_logprobs(llm: LLM) -> list[list[float | None]]:
    sp = SamplingParams(max_tokens=3, ignore_eos=True, prompt_logprobs=1, logit_bias={7: 2.0},
                        min_tokens=2)
    return [[x.logprob for x in r.prompt_logprobs] for r in llm.generate(PROMPTS[:3], sp)]


@pytest.mark.parametrize("arch", fast_corners([(a,) for a in ["llama", "llama3", "qwen2", "qwen3", "qwen3_moe"]],
                                              {("qwen3",)}))
def test_tp2_equals_tp1(tiny_ckpts, arch) -> None:
    kw = {"dtype": "float32", "device": "cpu", "max_prefill_length": 32, "page_size": 4,
          "cache": "naive" if arch == "qwen2" else "radix",
          "mixed_chunk": arch in ("llama3", "qwen3_moe")}
    one = LLM(str(tiny_ckpts[arch]), **kw)
    ref, ref_lps = tokens(one), prompt_logprobs(one)
    llm = LLM(str(tiny_ckpts[arch]), tp=2, **kw)
    try:
        assert tokens(llm) == ref
        assert tokens(llm) == ref  # again, through the warm prefix cache
        for got, want in zip(prompt_logprobs(llm), ref_lps):
            assert got[0] is None and got[1:] == pytest.approx(want[1:], abs=1e-4)
    finally:
        llm.close()


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_late_follower_still_serves_first_request(tiny_ckpts, monkeypatch) -> None:
    ref = tokens(LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu"))
    monkeypatch.setenv("RADIXSERVE_TP_FOLLOWER_DELAY_S", "3")
    start = time.monotonic()
    llm = LLM(str(tiny_ckpts["llama"]), tp=2, dtype="float32", device="cpu")
    try:
        assert time.monotonic() - start >= 3  # the leader waited for the late rank
        assert tokens(llm) == ref
    finally:
        llm.close()


def test_dead_follower_fails_leader_fast(tiny_ckpts) -> None:
    llm = LLM(str(tiny_ckpts["llama"]), tp=2, dtype="float32", device="cpu")
    (follower,) = llm.scheduler.followers
    follower.kill()
    follower.join()
    try:
        with pytest.raises(RuntimeError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"):
            llm.generate(PROMPTS, SP)
    finally:
        llm.close()


def test_invalid_tp_rejected_before_any_process(tiny_ckpts) -> None:
    with pytest.raises(ValueError, match="attention heads"):
        LLM(str(tiny_ckpts["llama"]), tp=3, dtype="float32", device="cpu")
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("radixserve-tp")]



def test_embedded_model_cannot_split_in_two_and_says_why() -> None:
    # SmolLM2-135M has 9 attention heads and 3 KV heads: TP=3 is its only split
    with pytest.raises(ValueError, match="9 attention heads"):
        LLM(None, tp=2, dtype="float32", device="cpu")


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_group_that_never_forms_fails_with_the_reason(tiny_ckpts, monkeypatch) -> None:
    ref = tokens(LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu"))
    monkeypatch.setenv("RADIXSERVE_TP_FOLLOWER_DELAY_S", "60")  # rank 1 never joins in time
    monkeypatch.setenv("RADIXSERVE_TP_INIT_TIMEOUT_S", "3")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="group of 2 did not form within 3 s"):
        LLM(str(tiny_ckpts["llama"]), tp=2, dtype="float32", device="cpu")
    assert time.monotonic() - start < 40
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("radixserve-tp")]
    # and the process can form a new group afterwards (the limit also covers a rank's start-up)
    monkeypatch.delenv("RADIXSERVE_TP_FOLLOWER_DELAY_S")
    monkeypatch.delenv("RADIXSERVE_TP_INIT_TIMEOUT_S")
    llm = LLM(str(tiny_ckpts["llama"]), tp=2, dtype="float32", device="cpu")
    try:
        assert tokens(llm) == ref
    finally:
        llm.close()


def test_bad_init_timeout_is_named(monkeypatch) -> None:
    from radixserve.distributed.torch_comm import init_timeout_s

    monkeypatch.setenv("RADIXSERVE_TP_INIT_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="RADIXSERVE_TP_INIT_TIMEOUT_S"):
        init_timeout_s()
