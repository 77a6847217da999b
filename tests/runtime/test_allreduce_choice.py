"""The all-reduce choice: small bf16/fp32 messages go to the symmetric-memory one-shot kernel,
larger ones to two-shot or NCCL by the policy's limits, and anything the kernels cannot take
(another dtype, a misaligned or oversized tensor, no buffer) to NCCL; `RADIXSERVE_ALLREDUCE`
forces a mode and a bad value is named. On CPU the group is gloo whatever the mode says, and
TP=2 still gives the TP=1 tokens."""
from __future__ import annotations

import pytest
import torch

from radixserve import LLM, SamplingParams
from radixserve.distributed.allreduce_choice import (
    ENV,
    NCCL,
    ONE_SHOT,
    TWO_SHOT,
    AllReducePolicy,
    is_aligned,
    policy_from_env,
)
from radixserve.distributed.symm_allreduce import try_symm_allreduce
from tests.runtime.helpers import random_prompts

KIB = 1024
AUTO = AllReducePolicy("auto", one_shot_max_bytes=64 * KIB, two_shot_max_bytes=1024 * KIB,
                       buffer_bytes=4096 * KIB)


@pytest.mark.parametrize("nbytes,want", [
    (16, ONE_SHOT), (64 * KIB, ONE_SHOT), (64 * KIB + 16, TWO_SHOT), (1024 * KIB, TWO_SHOT),
    (1024 * KIB + 16, NCCL), (4096 * KIB + 16, NCCL), (0, NCCL),
])
def test_auto_picks_by_size(nbytes, want) -> None:
    assert AUTO.pick(nbytes, torch.bfloat16, aligned=True, symm_ready=True) == want


def test_two_shot_off_by_default_limit_goes_from_one_shot_to_nccl() -> None:
    p = AllReducePolicy("auto", one_shot_max_bytes=64 * KIB, two_shot_max_bytes=0)
    assert p.pick(64 * KIB, torch.float32, True, True) == ONE_SHOT
    assert p.pick(128 * KIB, torch.float32, True, True) == NCCL


@pytest.mark.parametrize("why", ["float16", "misaligned", "no buffer", "too big", "mode nccl"])
def test_what_the_kernels_cannot_take_goes_to_nccl(why) -> None:
    p = AllReducePolicy("nccl") if why == "mode nccl" else AllReducePolicy("one_shot", buffer_bytes=64 * KIB)
    args = {"nbytes": 1024, "dtype": torch.bfloat16, "aligned": True, "symm_ready": True}
    args.update({"float16": {"dtype": torch.float16}, "misaligned": {"aligned": False},
                 "no buffer": {"symm_ready": False}, "too big": {"nbytes": 64 * KIB + 16},
                 "mode nccl": {}}[why])
    assert p.pick(**args) == NCCL


def test_forced_modes_ignore_the_size_limits() -> None:
    for mode in (ONE_SHOT, TWO_SHOT):
        p = AllReducePolicy(mode, one_shot_max_bytes=16, two_shot_max_bytes=16, buffer_bytes=KIB)
        assert p.pick(KIB, torch.bfloat16, True, True) == mode


def test_alignment_needs_contiguous_16_byte_pointer_and_size() -> None:
    x = torch.zeros(64, 8, dtype=torch.bfloat16)
    assert is_aligned(x)
    assert not is_aligned(x.t())  # not contiguous
    assert not is_aligned(x.view(-1)[1:9])  # pointer 2 bytes in
    assert not is_aligned(x.view(-1)[:7])  # 14 bytes


def test_env_sets_the_mode_and_a_bad_value_is_named(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert policy_from_env().mode == "auto" and policy_from_env().wants_symm_mem  # the default
    monkeypatch.setenv(ENV, "NCCL")
    assert policy_from_env().mode == "nccl" and not policy_from_env().wants_symm_mem
    monkeypatch.setenv(ENV, "fastest")
    with pytest.raises(ValueError, match=r"RADIXSERVE_ALLREDUCE must be one of auto, nccl, one_shot, two_shot"):
        policy_from_env()


def test_no_symmetric_memory_on_cpu() -> None:
    assert try_symm_allreduce(AllReducePolicy("one_shot"), 0, 2, torch.device("cpu"), "g") is None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_shot", "auto"])
def test_gloo_tp2_with_a_symmetric_mode_still_gives_tp1_tokens(tiny_ckpts, monkeypatch, mode) -> None:
    prompts = random_prompts(3, [1, 9, 40], 300, seed=5)
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    kw = {"dtype": "float32", "device": "cpu", "max_prefill_length": 32, "page_size": 4}
    ref = [r.token_ids for r in LLM(str(tiny_ckpts["llama"]), **kw).generate(prompts, sp)]
    monkeypatch.setenv(ENV, mode)
    llm = LLM(str(tiny_ckpts["llama"]), tp=2, **kw)
    try:
        assert [r.token_ids for r in llm.generate(prompts, sp)] == ref
    finally:
        llm.close()


def test_bad_mode_fails_the_tp_start_naming_the_variable(tiny_ckpts, monkeypatch) -> None:
    monkeypatch.setenv(ENV, "fastest")
    with pytest.raises((RuntimeError, ValueError), match="RADIXSERVE_ALLREDUCE"):
        LLM(str(tiny_ckpts["llama"]), tp=2, dtype="float32", device="cpu")


class FakeComm:
    """One rank's view of the MIN exchanges: `peer` is what the other rank contributes."""

    def __init__(self, peer: list[int]) -> None:
        self.peer, self.sent = list(peer), []

    def min_int(self, value: int) -> int:
        self.sent.append(value)
        return min(value, self.peer.pop(0))


@pytest.fixture
def fresh_process(monkeypatch):
    """`_agree_on_symm` as in a process that has made no buffer, with a stand-in buffer maker."""
    from radixserve.distributed import torch_comm

    made = []
    monkeypatch.setattr(torch_comm, "_SYMM_USED", False)
    monkeypatch.setattr(torch_comm, "try_symm_allreduce", lambda *a: made.append(a) or "buffer")
    return torch_comm, made


def test_symm_is_made_once_per_process_and_only_when_every_rank_agrees(fresh_process) -> None:
    torch_comm, made = fresh_process
    cuda, auto = torch.device("cuda", 0), AllReducePolicy("auto")
    comm = FakeComm([1, 1])
    assert torch_comm._agree_on_symm(comm, auto, 0, 2, cuda) == "buffer"
    assert len(made) == 1 and comm.sent == [1, 1]
    comm = FakeComm([1])  # a second group in this process: says no before anyone makes a buffer
    assert torch_comm._agree_on_symm(comm, auto, 0, 2, cuda) is None
    assert len(made) == 1 and comm.sent == [0]


def test_a_peer_that_cannot_or_will_not_makes_every_rank_use_nccl(fresh_process) -> None:
    torch_comm, made = fresh_process
    cuda, auto = torch.device("cuda", 0), AllReducePolicy("auto")
    assert torch_comm._agree_on_symm(FakeComm([0]), auto, 0, 2, cuda) is None  # peer declines
    assert made == []
    assert torch_comm._agree_on_symm(FakeComm([1, 0]), auto, 0, 2, cuda) is None  # peer failed
    assert len(made) == 1


def test_nccl_mode_and_cpu_never_make_a_buffer(fresh_process) -> None:
    torch_comm, made = fresh_process
    assert torch_comm._agree_on_symm(FakeComm([1]), AllReducePolicy("nccl"), 0, 2, torch.device("cuda", 0)) is None
    assert torch_comm._agree_on_symm(FakeComm([1]), AllReducePolicy("auto"), 0, 2, torch.device("cpu")) is None
    assert made == []
