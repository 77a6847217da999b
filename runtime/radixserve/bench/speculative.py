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
from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.bench.clock import device_sync
from radixserve.bench.workload import _WORDS
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler
from radixserve.speculative.drafter import BaseDrafter
from radixserve.speculative.speculator import Speculator

if TYPE_CHECKING:
    from radixserve.core.request import Req

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
    verify_steps: int  # requests' steps that verified drafts (a step of 8 drafting: 8)
    step_ms: float  # the mean wall time of a scheduler step
    verify_step_ms: float  # of a step that verified drafts (nan: none did)

    def drafts(self) -> str:
        if not self.verify_steps:
            return "nothing drafted"
        return (f"kept {self.kept}/{self.drafted} drafts ({self.kept / max(1, self.drafted):.0%}), "
                f"{(self.kept + self.verify_steps) / self.verify_steps:.2f} tokens a verify step "
                f"of {self.verify_step_ms:.2f} ms")


def run(sched: Scheduler, reqs: list[Prompted], batch: int, uid0: int = 0,
        outputs: dict[tuple[int, ...], list[int]] | None = None) -> Run:
    """The requests `batch` at a time (each group runs to its end before the next starts);
    `outputs` receives each prompt's tokens."""
    before = sched.stats()
    device_sync(sched.device)
    start, tokens = time.perf_counter(), 0
    steps, verify = 0, []  # (a step that verifies reads its tokens within it: its wall time
    for g in range(0, len(reqs), batch):  # is its device time and the host's around it)
        for i, r in enumerate(reqs[g: g + batch]):
            sched.add_request(uid0 + g + i, r.input_ids, r.params)
        while sched.has_work:
            t0, verified = time.perf_counter(), sched.spec.verify_steps if sched.spec else 0
            out = sched.step()
            steps += 1
            if sched.spec is not None and sched.spec.verify_steps > verified:
                verify.append(time.perf_counter() - t0)
            tokens += len(out)
            if outputs is not None:
                for o in out:
                    outputs.setdefault(tuple(reqs[o.uid - uid0].input_ids), []).append(o.token_id)
    device_sync(sched.device)
    secs = time.perf_counter() - start
    after = sched.stats()
    return Run(tokens / secs, tokens,
               *(after[k] - before[k] for k in ("spec_draft_tokens", "spec_accepted_tokens",
                                                "spec_verify_steps")),
               1e3 * secs / max(1, steps),
               1e3 * sum(verify) / len(verify) if verify else float("nan"))


def warm(sched: Scheduler, reqs: list[Prompted]) -> None:
    run(sched, reqs[:2], 2, uid0=10**9)
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class ReplayDrafter(BaseDrafter):
    """The bracket of `--bracket` (random weights give no real acceptance to measure): drafts
    each request's recorded continuation (`keep`: as a speculative run produced and kept it
    whole, `ceiling_record`, so every draft is kept and drafting costs nothing, the ceiling of
    the verify machinery) or tokens that differ from a plain run's at every position (none kept:
    the floor, what speculation costs where it fails, back-off included)."""

    def __init__(self, recorded: dict[tuple[int, ...], list[int]], keep: bool, vocab: int) -> None:
        self.recorded, self.keep, self.vocab = recorded, keep, vocab

    @classmethod
    def create(cls, engine_cfg, cfg, target, context) -> ReplayDrafter:
        raise TypeError("the bench's ReplayDrafter is made by the bench, not by a flag")

    def propose(self, reqs: list[Req], lengths: list[int]) -> list[list[int]]:
        out = []
        for r, n in zip(reqs, lengths):
            pos = len(r.output_ids)
            toks = self.recorded[tuple(r.input_ids)][pos: pos + n]
            out.append(toks if self.keep else [(t + 1) % self.vocab for t in toks])
        return out


def record(sched: Scheduler, reqs: list[Prompted], batch: int) -> dict[tuple[int, ...], list[int]]:
    """Each request's greedy tokens from a plain run (speculation off), `batch` at a time."""
    spec, sched.spec = sched.spec, None
    out: dict[int, list[int]] = {}
    for g in range(0, len(reqs), batch):
        for uid in range(g, min(g + batch, len(reqs))):
            sched.add_request(uid, reqs[uid].input_ids, reqs[uid].params)
        while sched.has_work:
            for o in sched.step():
                out.setdefault(o.uid, []).append(o.token_id)
    sched.spec = spec
    return {tuple(r.input_ids): out[uid] for uid, r in enumerate(reqs)}


CEILING_ROUNDS = 12


def ceiling_record(sched: Scheduler, reqs: list[Prompted], batch: int, k: int,
                   recorded: dict[tuple[int, ...], list[int]]) -> dict[tuple[int, ...], list[int]]:
    """Continuations a ceiling run keeps whole. Verifying k + 1 tokens at once rounds differently
    from decoding one (bf16 GEMMs of another shape), and random weights leave many near-ties, so
    a plain run's tokens part from the verified ones at the first such tie and every later draft
    fails (kept 54-75% on an H100 at batch 1). Each round replays the last round's own tokens
    until one keeps every draft (the fixed point), at most `CEILING_ROUNDS`: a round keeps at
    least the tokens up to the first the last one did not. Every step drafts k tokens whatever
    was kept (`adaptive=False`): the tokens after a rejection are then verified in steps of the
    same rows as the next round's, and round as they will (an adaptive drafter backs off to
    one-token steps there, whose tokens the next round's verification parts from again: 4 rounds
    kept 88-95% on an H200)."""
    for _ in range(CEILING_ROUNDS):
        sched.spec = Speculator(ReplayDrafter(recorded, True, sched.vocab_size), k, adaptive=False)
        out: dict[tuple[int, ...], list[int]] = {}
        r = run(sched, reqs, batch, uid0=10**6, outputs=out)
        if r.kept == r.drafted:
            break
        recorded = out
    return recorded


def bracket(sched: Scheduler, reqs: list[Prompted], batch_sizes: list[int],
            draft_tokens: list[int]) -> None:
    """Plain decoding, then the ceiling and the floor for each number of draft tokens, on one
    scheduler (same KV pool and CUDA graphs), each batch size in turn; prints a row each."""
    spec = sched.spec
    for bs in batch_sizes:
        recorded = record(sched, reqs, bs)
        sched.spec = None
        warm(sched, reqs)
        base = run(sched, reqs, bs, uid0=10**6)
        print(f"batch {bs:>4} plain {base.tokens_per_s:10.1f} output tok/s, a step "
              f"{base.step_ms:.2f} ms", flush=True)
        for k in draft_tokens:
            kept_whole = ceiling_record(sched, reqs, bs, k, recorded)
            for keep, label in ((True, "ceiling"), (False, "floor")):
                sched.spec = Speculator(ReplayDrafter(kept_whole if keep else recorded, keep,
                                                      sched.vocab_size), k, adaptive=not keep)
                r = run(sched, reqs, bs, uid0=10**6)
                # what a verification step's time gives where all k drafts are kept
                whole = (f"; all kept: {(k + 1) * base.step_ms / r.verify_step_ms:.2f}x"
                         if keep and r.verify_steps else "")
                print(f"batch {bs:>4} {label:<7} k={k} {r.tokens_per_s:10.1f} output tok/s "
                      f"{r.tokens_per_s / base.tokens_per_s:6.3f}x plain  {r.drafts()}{whole}",
                      flush=True)
    sched.spec = spec
