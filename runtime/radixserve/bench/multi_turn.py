"""`radixserve bench offline --multi-turn CONVERSATIONS TURNS`: conversations in a closed loop,
each turn's prompt the whole conversation so far (its `--history-len`-token opening, then every
earlier question and answer) plus a new question; a conversation sends its next turn as soon as
its answer is complete. The device KV pool holds `--kv-share` of the working set (every
conversation's final context), so a conversation's history is often evicted before it comes
back; timed without then with the host KV tier (`--enable-hierarchical-cache`, sized by
`--hicache-ratio`/`--hicache-size`), in one command: prompt tokens computed, TTFT p50/p99 (from a
turn's submission to its first token) and throughput.

`--max-parallel P` bounds the turns in flight, as SGLang's `bench_multiturn.py` does: a turn
ready while P are in flight waits on the client's side (first come, first sent), and its TTFT
counts from its submission. Unbounded, every conversation's turn waits in the engine's queue,
and by Little's law a closed loop's TTFT is then mostly that queue (it follows 1 / throughput);
bounded at what the pool holds, it is what a turn's own prefill or load-back costs."""
from __future__ import annotations

import collections
import dataclasses
import gc
import random
import time
from typing import NamedTuple

import torch

from radixserve.bench.clock import device_sync
from radixserve.bench.offline import describe
from radixserve.bench.online import percentiles
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.tp import scheduler_group


class Conversation(NamedTuple):
    opening: list[int]  # the history the first turn starts from
    questions: list[list[int]]  # one per turn
    answers: list[int]  # each turn's answer length


class TurnsRun(NamedTuple):
    secs: float
    output_tokens: int
    prompt_tokens: int  # of every turn (what a server without a prefix cache would compute)
    prefill_tokens: int  # computed
    ttft: list[float]  # seconds, one per turn
    host_hit_tokens: int


def conversations(num: int, turns: int, history_len: int, question_range: tuple[int, int],
                  answer_range: tuple[int, int], vocab_size: int, seed: int) -> list[Conversation]:
    rng = random.Random(seed)
    hi = max(2, min(vocab_size, 32000) - 1)

    def ids(n: int) -> list[int]:
        return [rng.randint(1, hi) for _ in range(n)]

    return [Conversation(ids(history_len), [ids(rng.randint(*question_range)) for _ in range(turns)],
                         [rng.randint(*answer_range) for _ in range(turns)]) for _ in range(num)]


def working_set(convs: list[Conversation]) -> int:
    """Tokens of every conversation's final context."""
    return sum(len(c.opening) + sum(map(len, c.questions)) + sum(c.answers) for c in convs)


def run_turns(sched, convs: list[Conversation], uid0: int = 0,
              max_parallel: int | None = None) -> TurnsRun:
    """Every conversation's turns, each ready when the one before it has its answer, and sent
    while fewer than `max_parallel` are in flight (None: at once)."""
    device_sync(sched.device)
    before = sched.stats()
    start = time.perf_counter()
    context = [list(c.opening) for c in convs]
    turn = [0] * len(convs)
    sent: dict[int, tuple[int, float]] = {}  # uid -> (conversation, time sent)
    ttft: list[float] = []
    prompt_tokens = output_tokens = 0
    uid = uid0

    def send(i: int) -> None:
        nonlocal uid, prompt_tokens
        context[i] += convs[i].questions[turn[i]]
        prompt_tokens += len(context[i])
        sched.add_request(uid, context[i], SamplingParams(max_tokens=convs[i].answers[turn[i]],
                                                          ignore_eos=True))
        sent[uid] = (i, time.perf_counter())
        uid += 1

    ready = collections.deque(range(len(convs)))  # conversations whose next turn waits

    def send_ready() -> None:
        while ready and (max_parallel is None or len(sent) < max_parallel):
            send(ready.popleft())

    send_ready()
    while sched.has_work:
        for o in sched.step():
            i, t0 = sent[o.uid]
            output_tokens += 1
            context[i].append(o.token_id)
            if t0:  # its first token
                ttft.append(time.perf_counter() - t0)
                sent[o.uid] = (i, 0.0)
            if o.finished:
                del sent[o.uid]
                turn[i] += 1
                if turn[i] < len(convs[i].questions):
                    ready.append(i)
        send_ready()
    device_sync(sched.device)
    after = sched.stats()
    return TurnsRun(time.perf_counter() - start, output_tokens, prompt_tokens,
                    after["prefill_tokens"] - before["prefill_tokens"], ttft,
                    after["host_hit_tokens"] - before["host_hit_tokens"])


def run_multi_turn(eng: EngineConfig, sch: SchedulerConfig, convs: list[Conversation],
                   max_parallel: int | None = None) -> dict[bool, TurnsRun]:
    """Without, then with the host tier; each line printed as it lands."""
    runs: dict[bool, TurnsRun] = {}
    for tier in (False, True):
        with scheduler_group(eng, dataclasses.replace(sch, enable_hierarchical_cache=tier)) as sched:
            r = runs[tier] = run_turns(sched, convs, max_parallel=max_parallel)
            p = percentiles(r.ttft, (50, 99))
            print(f"{'radixserve host tier ' + ('on' if tier else 'off'):<26} "
                  f"{r.output_tokens / r.secs:>9.1f} output tok/s "
                  f"{(r.output_tokens + r.prompt_tokens) / r.secs:>10.1f} total tok/s   "
                  f"prefill tokens computed {r.prefill_tokens:>8} of {r.prompt_tokens}   "
                  f"TTFT p50 {p[50] * 1e3:.1f} ms p99 {p[99] * 1e3:.1f} ms   host hits "
                  f"{r.host_hit_tokens} tokens   [{describe(sched)}]", flush=True)
            del sched
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    off, on = runs[False], runs[True]
    p_off, p_on = percentiles(off.ttft, (50, 99)), percentiles(on.ttft, (50, 99))
    print(f"{'ratio host tier on/off':<26} {(on.output_tokens / on.secs) / (off.output_tokens / off.secs):>9.3f}x "
          f"throughput, {on.prefill_tokens / max(off.prefill_tokens, 1):.3f}x prefill tokens, "
          f"TTFT p50 {p_on[50] / p_off[50]:.3f}x, p99 {p_on[99] / p_off[99]:.3f}x", flush=True)
    return runs
