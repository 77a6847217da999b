"""`bench offline --multi-turn` on the client's side: each turn carries the whole conversation so
far, is sent only after the one before it answered, and `--max-parallel` bounds the turns in
flight (the rest wait, first ready first sent), every turn still answered. A stand-in scheduler
answers one token a step for every request it holds."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixserve.bench.multi_turn import conversations, run_turns


class StubScheduler:
    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.live: dict[int, list] = {}  # uid -> [tokens left, next token]
        self.prompts: dict[int, list[int]] = {}
        self.most_in_flight = 0

    def add_request(self, uid: int, ids: list[int], params) -> None:
        self.prompts[uid] = list(ids)
        self.live[uid] = [params.max_tokens, 1000 + uid]
        self.most_in_flight = max(self.most_in_flight, len(self.live))

    @property
    def has_work(self) -> bool:
        return bool(self.live)

    def step(self) -> list[SimpleNamespace]:
        out = []
        for uid, rec in list(self.live.items()):
            rec[0] -= 1
            out.append(SimpleNamespace(uid=uid, token_id=rec[1], finished=rec[0] == 0))
            if rec[0] == 0:
                del self.live[uid]
        return out

    def stats(self) -> dict[str, int]:
        return {"prefill_tokens": 0, "host_hit_tokens": 0}


@pytest.mark.parametrize("max_parallel", [None, 1, 3])
def test_turns_carry_their_history_and_respect_the_bound(max_parallel: int | None) -> None:
    convs = conversations(5, 3, 6, (2, 4), (1, 3), vocab_size=50, seed=1)
    sched = StubScheduler()
    run = run_turns(sched, convs, max_parallel=max_parallel)
    assert sched.most_in_flight == (max_parallel or len(convs))
    assert len(run.ttft) == 15 and run.output_tokens == sum(sum(c.answers) for c in convs)
    # each conversation's prompts, in the order sent: opening + q1, then + a1 + q2, ...
    by_conv: dict[int, list[list[int]]] = {}
    for uid in sorted(sched.prompts):
        p = sched.prompts[uid]
        i = next(i for i, c in enumerate(convs) if p[:len(c.opening)] == c.opening)
        by_conv.setdefault(i, []).append(p)
    for i, c in enumerate(convs):
        want = list(c.opening)
        for t, prompt in enumerate(by_conv[i]):
            want += c.questions[t]
            assert prompt == want
            uid = min(u for u, p in sched.prompts.items() if p == prompt)
            want = want + [1000 + uid] * c.answers[t]
    assert run.prompt_tokens == sum(len(p) for p in sched.prompts.values())
