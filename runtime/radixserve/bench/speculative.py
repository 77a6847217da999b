"""`radixserve bench speculative`: output tokens/s with speculative decoding against plain decoding
on the same requests, in one command, and what the drafts achieved (kept/drafted, tokens a
verification step produced).

Workloads: `repeat` asks the model to repeat a list of words word for word (its output quotes its
prompt: what prompt lookup drafts well), `chat` asks for a short story (little to look up), both
through the model's chat template; `random` is decoding past random token ids with EOS ignored
(for dummy weights, where no text means anything: there the drafter's acceptance is set by its
choice, the target's own weights as draft keeping every draft, a different model's none)."""
from __future__ import annotations

import random
import time
from typing import NamedTuple

import torch

from radixserve.bench.clock import device_sync
from radixserve.bench.workload import _WORDS
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler

WORKLOADS = ("repeat", "chat", "random")


class Prompted(NamedTuple):
    input_ids: list[int]
    params: SamplingParams


def workload(name: str, model_path, num: int, max_tokens: int, vocab: int) -> list[Prompted]:
    rng = random.Random(0)
    if name == "random":
        return [Prompted([rng.randint(1, min(vocab, 32000) - 1) for _ in range(128)],
                         SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for _ in range(num)]
    from radixserve.messages import TokenizeMsg
    from radixserve.tokenizer.load import load_tokenizer
    from radixserve.tokenizer.tokenize import TokenizeManager

    tok = TokenizeManager(load_tokenizer(str(model_path)))  # (the server's own chat prompts)
    out = []
    for _ in range(num):
        words = " ".join(rng.choice(_WORDS) for _ in range(max_tokens // 2))
        ask = (f"Repeat the following words exactly, word for word:\n\n{words}" if name == "repeat"
               else f"Write a short story about a {rng.choice(_WORDS)}.")
        params = SamplingParams(max_tokens=max_tokens)
        ids = tok.tokenize(TokenizeMsg(0, params, chat=[{"role": "user", "content": ask}]))
        out.append(Prompted(ids, params))
    return out


class Run(NamedTuple):
    tokens_per_s: float
    tokens: int
    drafted: int
    kept: int
    verify_steps: int

    def drafts(self) -> str:
        if not self.verify_steps:
            return "nothing drafted"
        return (f"kept {self.kept}/{self.drafted} drafts ({self.kept / max(1, self.drafted):.0%}), "
                f"{(self.kept + self.verify_steps) / self.verify_steps:.2f} tokens a verify step")


def run(sched: Scheduler, reqs: list[Prompted], batch: int, uid0: int = 0) -> Run:
    """The requests `batch` at a time (each group runs to its end before the next starts)."""
    before = sched.stats()
    device_sync(sched.device)
    start, tokens = time.perf_counter(), 0
    for g in range(0, len(reqs), batch):
        for i, r in enumerate(reqs[g: g + batch]):
            sched.add_request(uid0 + g + i, r.input_ids, r.params)
        while sched.has_work:
            tokens += len(sched.step())
    device_sync(sched.device)
    secs = time.perf_counter() - start
    after = sched.stats()
    return Run(tokens / secs, tokens,
               *(after[k] - before[k] for k in ("spec_draft_tokens", "spec_accepted_tokens",
                                                "spec_verify_steps")))


def warm(sched: Scheduler, reqs: list[Prompted]) -> None:
    run(sched, reqs[:2], 2, uid0=10**9)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
