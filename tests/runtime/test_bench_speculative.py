"""`bench speculative --bracket`: the ceiling's replayed drafts are all kept even where a plain
run's tokens part from what verification produces (bf16 near-ties on a GPU; simulated here by a
record that goes wrong part-way), and the floor's none."""
from __future__ import annotations

from radixserve.bench import speculative as bench
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.scheduler.scheduler import Scheduler
from radixserve.speculative.speculator import Speculator

K = 4


def _setup(tiny_ckpts) -> tuple[Scheduler, list[bench.Prompted]]:
    path = tiny_ckpts["qwen3"]
    sched = Scheduler(EngineConfig(model=str(path), dtype="float32", device="cpu",
                                   max_kv_tokens=8192),
                      SchedulerConfig(max_running_requests=4, speculative_algorithm="ngram"))
    return sched, bench.workload("random", path, 3, 24, sched.vocab_size)


def test_the_ceiling_keeps_every_draft_where_the_plain_record_parts_from_verification(
        tiny_ckpts) -> None:
    sched, reqs = _setup(tiny_ckpts)
    plain = bench.record(sched, reqs, 2)
    # a plain run that parted from verification after 5 tokens (as a near-tie does in bf16)
    parted = {p: t[:5] + [(x + 1) % sched.vocab_size for x in t[5:]] for p, t in plain.items()}
    sched.spec = Speculator(bench.ReplayDrafter(parted, True, sched.vocab_size), K)
    naive = bench.run(sched, reqs, 2, uid0=10**6)
    assert naive.kept < naive.drafted  # replaying it, later drafts fail

    whole = bench.ceiling_record(sched, reqs, 2, K, parted)
    assert whole == plain  # (on CPU in float32 the verified tokens are the plain ones)
    sched.spec = Speculator(bench.ReplayDrafter(whole, True, sched.vocab_size), K)
    ceiling = bench.run(sched, reqs, 2, uid0=10**6)
    assert ceiling.drafted > 0 and ceiling.kept == ceiling.drafted
    sched.spec = Speculator(bench.ReplayDrafter(plain, False, sched.vocab_size), K)
    floor = bench.run(sched, reqs, 2, uid0=10**6)
    assert floor.drafted > 0 and floor.kept == 0
    sched.check_integrity()


def _plain_steps(r: bench.Run, num_reqs: int) -> int:
    """Request-steps that decoded one token without drafting (each prompt's first token comes
    from its prefill)."""
    return r.tokens - num_reqs - r.verify_steps - r.kept


def test_the_ceilings_drafter_drafts_in_every_step_after_a_rejection(tiny_ckpts) -> None:
    # an adaptive drafter backs off to one-token steps after rejections: their tokens round
    # differently from a verification step's on a GPU, so the ceiling's rounds draft every step
    sched, reqs = _setup(tiny_ckpts)
    plain = bench.record(sched, reqs, 2)
    parted = {p: t[:5] + [(x + 1) % sched.vocab_size for x in t[5:]] for p, t in plain.items()}
    runs = {}
    for adaptive in (True, False):
        sched.spec = Speculator(bench.ReplayDrafter(parted, True, sched.vocab_size), K,
                                adaptive=adaptive)
        runs[adaptive] = bench.run(sched, reqs, 2, uid0=10**6)
    assert _plain_steps(runs[True], len(reqs)) > len(reqs)  # backed off
    # fixed: only each request's last token (max_tokens) is decoded without drafts
    assert _plain_steps(runs[False], len(reqs)) == len(reqs)
    assert runs[False].drafted > runs[True].drafted
    sched.check_integrity()
