"""Constrained requests that must fail alone, and grammar compilation kept within bounds, in the
scheduler on CPU: a grammar that admits no output is refused before any of its prompt is
computed; a dead end met while generating, or a row of logits with nothing to sample from, fails
that request alone while its neighbours' tokens stay those of a run without it; a compilation past
its time or memory limit fails with a 400 naming the limit, and one no request waits for any more
is stopped at once, freeing its worker."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch

from radixserve import SamplingParams
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.core.request import Req
from radixserve.engine.sampler import Sampler
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import random_prompts

ANY_OBJECT = json.dumps({"type": "object"})
# (grammar field, text) that no output satisfies: dead at once, or after the text they force
ADMITS_NOTHING = [
    ("ebnf", "root ::= root"),
    ("ebnf", "root ::= a\na ::= root"),
    ("regex", r"[^\s\S]"),
    ("json_schema", json.dumps({"type": "string", "pattern": r"[^\s\S]"})),
    ("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "string", "pattern": r"[^\s\S]"}},
                                "required": ["a"], "additionalProperties": False})),
]
# a choice first, then nothing: only generating finds the dead end
DEAD_AFTER_A_CHOICE = 'root ::= ("a" | "b") dead\ndead ::= [^\\0-\\U0010ffff]'


def optional_properties(n: int, prefix: str = "p") -> str:
    """A schema xgrammar needs minutes and gigabytes to compile for n in the thousands."""
    return json.dumps({"type": "object", "properties": {f"{prefix}{i}": {"type": "string"} for i in range(n)}})


def make(path, overlap: bool = True) -> Scheduler:
    eng = EngineConfig(model=str(path), dtype="float32", device="cpu")
    return Scheduler(eng, SchedulerConfig(max_running_requests=8, overlap=overlap))


def run(s: Scheduler, limit_s: float = 120.0) -> tuple[dict[int, list], list]:
    """Step until idle (failing past `limit_s`): each request's outputs, and the failures."""
    outs: dict[int, list] = {}
    failures: list = []
    deadline = time.monotonic() + limit_s
    while s.has_work:
        assert time.monotonic() < deadline, f"still working after {limit_s}s: {s.stats()}"
        for o in s.step():
            outs.setdefault(o.uid, []).append(o)
        failures += s.take_failures()
    return outs, failures


def children(pid: int | None = None) -> set[int]:
    """The live child processes of `pid` (default: this process; the grammar trials among them)."""
    pid = os.getpid() if pid is None else pid
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry))
    return out


@pytest.fixture(scope="module")
def path(tiny_ckpts):
    return tiny_ckpts["llama"]


@pytest.mark.parametrize(("kind", "text"), ADMITS_NOTHING)
def test_a_grammar_that_admits_no_output_is_refused_before_its_prompt_is_computed(path, kind, text) -> None:
    s = make(path)
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    s.add_request(1, [5, 6, 8, 9], SamplingParams(max_tokens=4, temperature=1.0, seed=3, **{kind: text}))
    outs, failures = run(s)
    ((uid, message, param, status),) = failures
    assert (uid, param, status) == (1, kind, 400)
    assert message.startswith(f"{kind}: the grammar admits no output"), message
    assert list(outs) == [0] and len(outs[0]) == 4
    assert s.prefill_tokens == 3  # the neighbour's prompt alone: the refused one never ran
    s.check_integrity()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_dead_end_met_while_generating_fails_that_request_alone(path, overlap, temperature) -> None:
    prompts = random_prompts(2, [6, 9], 300, seed=3)
    plain = SamplingParams(max_tokens=8, ignore_eos=True, temperature=temperature, seed=1)
    alone = make(path, overlap)
    alone.add_request(0, prompts[0], plain)
    ref, _ = run(alone)
    s = make(path, overlap)
    s.add_request(0, prompts[0], plain)
    s.add_request(1, prompts[1], SamplingParams(max_tokens=8, temperature=temperature, seed=2,
                                                ebnf=DEAD_AFTER_A_CHOICE))
    outs, failures = run(s)
    ((uid, message, param, status),) = failures
    assert (uid, param, status) == (1, "ebnf", 400)
    assert message == "ebnf: the grammar allows no token after the 1 generated: no output can complete it"
    from transformers import AutoTokenizer

    (first,) = outs[1]  # the choice, then the failure instead of a token
    assert not first.finished and AutoTokenizer.from_pretrained(path).decode([first.token_id]) in ("a", "b")
    assert [o.token_id for o in outs[0]] == [o.token_id for o in ref[0]]
    s.check_integrity()
    assert not s.has_work and s.stats()["running"] == 0


def test_rows_with_nothing_to_sample_from_are_flagged_not_fatal() -> None:
    """NaN, +inf, or -inf throughout: multinomial would fail (a device assert on CUDA); such a
    row is flagged and sampled as uniform, the others as ever."""
    reqs = [Req(i, [1], SamplingParams(temperature=1.0, seed=i)) for i in range(4)]
    sampler = Sampler(torch.device("cpu"))
    for r in reqs:
        r.generator = sampler.new_request_generator(r.params.seed)
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    logits[1] = float("-inf")
    logits[2, 7] = float("nan")
    logits[3, 9] = float("inf")
    good = logits[0].clone()
    res = sampler.sample(logits, reqs)
    assert res.invalid is not None and res.invalid.tolist() == [False, True, True, True]
    want = torch.multinomial(torch.softmax(good, -1), 1, generator=sampler.new_request_generator(0))
    assert res.tokens[0] == want[0]


def test_logits_with_no_valid_value_fail_that_request_alone(path, monkeypatch) -> None:
    prompts = random_prompts(2, [5, 8], 300, seed=4)
    sampled = SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0, seed=7)
    alone = make(path)
    alone.add_request(1, prompts[1], sampled)
    ref, _ = run(alone)
    s = make(path)
    sample = s.sampler.sample

    def poisoned(logits, reqs, store=None):  # a model that answers NaN for request 0
        for i, r in enumerate(reqs):
            if r.uid == 0:
                logits[i] = float("nan")
        return sample(logits, reqs, store)

    monkeypatch.setattr(s.sampler, "sample", poisoned)
    s.add_request(0, prompts[0], SamplingParams(max_tokens=6, temperature=0.8, seed=2))
    s.add_request(1, prompts[1], sampled)
    outs, failures = run(s)
    assert [(f.uid, f.param, f.status) for f in failures] == [(0, None, 500)]
    assert "NaN" in failures[0].message and 0 not in outs
    assert [o.token_id for o in outs[1]] == [o.token_id for o in ref[1]]
    s.check_integrity()


# a compilation that holds a core for the whole 10 s limit (the abandoned compilations' test
# stays in the fast loop)
@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_a_compilation_past_the_time_limit_is_a_400_naming_it(path, monkeypatch) -> None:
    # 10 s: the small grammar compiles well within it on a loaded CI machine; the large one takes minutes
    monkeypatch.setenv("RADIXSERVE_GRAMMAR_COMPILE_TIMEOUT_S", "10")
    before = children()
    s = make(path)
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=4, json_schema=optional_properties(3000)))
    s.add_request(1, [5, 6, 8], SamplingParams(max_tokens=4, json_schema=ANY_OBJECT))
    s.add_request(2, [5, 6, 9], SamplingParams(max_tokens=4, ignore_eos=True))
    outs, failures = run(s, limit_s=60)
    assert len(failures) == 1, failures
    ((uid, message, param, status),) = failures
    assert (uid, param, status) == (0, "json_schema", 400)
    assert "did not compile within 10s" in message and "RADIXSERVE_GRAMMAR_COMPILE_TIMEOUT_S" in message
    assert outs[1][-1].finished and len(outs[2]) == 4
    assert children() <= before  # the trial was killed and reaped


# a compilation that holds a core for seconds, until it passes 100 MiB
@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_a_compilation_past_the_memory_limit_is_a_400_naming_it(path, monkeypatch) -> None:
    monkeypatch.setenv("RADIXSERVE_GRAMMAR_COMPILE_MEMORY_MB", "100")
    monkeypatch.setenv("RADIXSERVE_GRAMMAR_COMPILE_TIMEOUT_S", "600")
    s = make(path)
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=4, json_schema=optional_properties(2000)))
    s.add_request(1, [5, 6, 8], SamplingParams(max_tokens=4, json_schema=ANY_OBJECT))
    outs, failures = run(s, limit_s=300)
    ((uid, message, param, status),) = failures
    assert (uid, param, status) == (0, "json_schema", 400)
    assert "100 MiB" in message and "RADIXSERVE_GRAMMAR_COMPILE_MEMORY_MB" in message, message
    assert outs[1][-1].finished


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_the_memory_limit_holds_where_the_allocator_keeps_freed_memory(path) -> None:
    """A long-running process's allocator keeps memory it freed mapped: a compilation forked from
    it fills those chunks without a new mapping, which the child's RLIMIT_DATA cannot see; the
    parent's watch of the pages the child writes still stops it at the limit."""
    import threading

    import xgrammar as xgr
    from transformers import AutoTokenizer

    from radixserve.constrained.grammar_calls import GrammarError
    from radixserve.constrained.trial import try_compile

    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(path))
    held = [bytes(4096) for _ in range(400_000)]  # 1.6 GB through malloc, on this thread's arena
    top = held[-1]  # keeps the freed chunks below it from being trimmed
    del held
    start = time.monotonic()
    with pytest.raises(GrammarError, match="more than the 100 MiB"):
        try_compile(info, "json_schema", optional_properties(2000), 100, threading.Event())
    assert time.monotonic() - start < 60
    del top


def test_an_abandoned_compilation_is_stopped_and_frees_its_worker(path, monkeypatch) -> None:
    """Both workers busy with grammars of minutes, then their requests aborted: the compilations
    stop at once (no process left behind), and a small grammar is served without waiting."""
    monkeypatch.setenv("RADIXSERVE_GRAMMAR_COMPILE_TIMEOUT_S", "600")
    before = children()
    s = make(path)
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=4, json_schema=optional_properties(3000, "a")))
    s.add_request(1, [5, 6, 8], SamplingParams(max_tokens=4, json_schema=optional_properties(3000, "b")))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3:  # both well under way
        s.step()
        time.sleep(0.05)
    s.abort(0)
    s.abort(1)
    s.add_request(2, [5, 6, 9], SamplingParams(max_tokens=4, json_schema=ANY_OBJECT))
    outs, failures = run(s, limit_s=30)
    assert failures == [] and outs[2][-1].finished
    assert s.stats()["aborted_waiting"] == 2
    while children() - before:
        assert time.monotonic() - t0 < 40, "an abandoned compilation is still running"
        time.sleep(0.05)
