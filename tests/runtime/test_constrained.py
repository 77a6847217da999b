"""Grammar-constrained decoding (xgrammar) in the scheduler, on CPU.

Every constrained output is checked by an independent xgrammar matcher built here from the
tokenizer (not the scheduler's own state): each generated prefix must be accepted, and a "stop"
must leave the matcher terminated. On the tiny random model the grammar may not complete within
max_tokens (prefix-validity only, except for grammars that finish in a few tokens); the embedded
SmolLM2 must complete bounded schemas, and its JSON must validate with `jsonschema`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re

import pytest

from radixserve import LLM, SamplingParams
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.messages import UserMsg, decode, encode
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import drain, random_prompts

SCHEMA = json.dumps({"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "string", "maxLength": 4}}, "required": ["a", "b"]})
REGEX = "(yes|no)[0-9]"
EBNF = 'root ::= ("cat" | "dog") " " [0-9] [0-9]'
GRAMMARS = [("json_schema", SCHEMA), ("regex", REGEX), ("ebnf", EBNF)]


@functools.cache
def reference_compiler(model_path: str):
    """xgrammar set up here, apart from radixserve's own compiler."""
    import xgrammar as xgr
    from transformers import AutoConfig, AutoTokenizer

    from radixserve.models.generation import eos_token_ids

    info = xgr.TokenizerInfo.from_huggingface(
        AutoTokenizer.from_pretrained(model_path),
        vocab_size=AutoConfig.from_pretrained(model_path).vocab_size,
        stop_token_ids=sorted(eos_token_ids(model_path)))
    return xgr.GrammarCompiler(info)


def reference_matcher(model_path, kind: str, text: str):
    import xgrammar as xgr

    c = reference_compiler(str(model_path))
    compiled = {"json_schema": lambda: c.compile_json_schema(text, any_whitespace=False),
                "regex": lambda: c.compile_regex(text),
                "ebnf": lambda: c.compile_grammar(text)}[kind]()
    return xgr.GrammarMatcher(compiled)


def assert_follows(model_path, kind: str, text: str, tokens: list[int], reason: str) -> None:
    m = reference_matcher(model_path, kind, text)
    for j, t in enumerate(tokens):
        assert m.accept_token(t), f"{kind}: token {j} ({t}) is forbidden after {tokens[:j]}"
    assert m.is_terminated() == (reason == "stop"), (kind, tokens, reason)


def make(path, overlap: bool, page_size: int = 1, **sched) -> Scheduler:
    eng = EngineConfig(model=str(path), dtype="float32", device="cpu", page_size=page_size)
    return Scheduler(eng, SchedulerConfig(**{"max_running_requests": 8, "overlap": overlap, **sched}))




@pytest.fixture(scope="module")
def path(tiny_ckpts):
    return tiny_ckpts["llama"]


def test_sampling_params_grammar_fields() -> None:
    assert not SamplingParams().constrained
    sp = SamplingParams(json_schema='{"type": "object"}')
    assert sp.constrained and sp.grammar == ("json_schema", '{"type": "object"}')
    assert SamplingParams(ebnf=EBNF).grammar == ("ebnf", EBNF)
    with pytest.raises(ValueError, match=r"^regex cannot be combined with json_schema"):
        SamplingParams(json_schema="{}", regex="a")
    with pytest.raises(ValueError, match=r"^ebnf cannot be combined with regex"):
        SamplingParams(regex="a", ebnf=EBNF)
    with pytest.raises(ValueError, match=r"^json_schema must be valid JSON"):
        SamplingParams(json_schema="{not json")
    with pytest.raises(ValueError, match=r"^regex must be a non-empty string"):
        SamplingParams(regex="")
    with pytest.raises(ValueError, match=r"^ebnf must be a non-empty string"):
        SamplingParams(ebnf=3)  # type: ignore[arg-type]
    # through msgpack (server processes) and the TP broadcast (dataclasses.asdict)
    for kind, text in GRAMMARS:
        sp = SamplingParams(max_tokens=3, **{kind: text})
        back = decode(encode(UserMsg(1, [5, 6], sp)))
        assert back.params == sp and back.params.grammar == (kind, text)
        assert SamplingParams(**dataclasses.asdict(sp)) == sp


@pytest.mark.parametrize("page_size,max_prefill",
                         [(1, 8192), pytest.param(4, 16, marks=pytest.mark.slow)])
def test_mixed_batch_follows_grammars_and_leaves_others_unchanged(path, page_size, max_prefill):
    """Constrained requests of each kind mixed with unconstrained ones, over chunked prefill and
    pages: every constrained output obeys its grammar, the unconstrained tokens are those of a
    run without the constrained requests, and overlap on and off agree."""
    prompts = random_prompts(12, [3, 40, 77, 9, 120, 5], 300, seed=21)
    plain = SamplingParams(max_tokens=10, ignore_eos=True)
    grammar_of = {u: GRAMMARS[u % 3] for u in range(1, 12, 2)}  # odd uids are constrained

    def params(u: int) -> SamplingParams:
        if u not in grammar_of:
            return plain
        kind, text = grammar_of[u]
        return SamplingParams(max_tokens=24, **{kind: text})

    ref_s = make(path, overlap=True, page_size=page_size, max_prefill_length=max_prefill)
    for u in range(0, 12, 2):
        ref_s.add_request(u, prompts[u], plain)
    ref = {u: [o.token_id for o in outs] for u, outs in drain(ref_s).items()}
    runs = {}
    for overlap in (False, True):
        s = make(path, overlap, page_size=page_size, max_prefill_length=max_prefill)
        for u, p in enumerate(prompts):
            s.add_request(u, p, params(u))
        out = drain(s)
        runs[overlap] = {u: [o.token_id for o in outs] for u, outs in out.items()}
        for u, outs in out.items():
            assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
            if u in grammar_of:
                assert_follows(path, *grammar_of[u], runs[overlap][u], outs[-1].finish_reason)
            else:
                assert runs[overlap][u] == ref[u], f"request {u} changed by its neighbours"
        assert s.grammars.compiler._cache.keys() == set(grammar_of.values())  # compiled once each
    assert runs[False] == runs[True]
    # the short regex and EBNF grammars complete within max_tokens, even on random weights
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    for u, (kind, text) in grammar_of.items():
        if kind != "json_schema":
            toks = runs[True][u]
            assert toks[-1] in (2, 4), "a complete grammar ends with the model's EOS"
            assert re.fullmatch(r"(yes|no)[0-9]" if kind == "regex" else r"(cat|dog) \d\d",
                                tok.decode(toks[:-1]))


def test_sampling_penalties_and_logprobs_see_the_masked_distribution(path) -> None:
    """Temperature/top-p/top-k with seeds, penalties (which turn overlap off) and logprobs all
    act after the mask: every token obeys the grammar, and each step's top logprobs that are
    finite are tokens the grammar allowed (logprobs are of the masked distribution)."""
    import xgrammar as xgr  # noqa: F401 -- the reference matcher's fork below

    s = make(path, overlap=True)
    prompts = random_prompts(6, [4, 30, 11], 300, seed=5)
    params = [
        SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, seed=1, json_schema=SCHEMA),
        SamplingParams(max_tokens=20, temperature=1.5, top_k=20, seed=2, json_schema=SCHEMA),
        SamplingParams(max_tokens=20, temperature=0.7, min_p=0.05, seed=3, regex="[a-z]{2,6}!"),
        SamplingParams(max_tokens=20, repetition_penalty=1.3, presence_penalty=0.5,
                       json_schema=SCHEMA),
        SamplingParams(max_tokens=20, logprobs=5, json_schema=SCHEMA),
        SamplingParams(max_tokens=20, logprobs=3, temperature=1.0, seed=4, ebnf=EBNF),
    ]
    for u, (p, sp) in enumerate(zip(prompts, params)):
        s.add_request(u, p, sp)
    out = drain(s)
    for u, outs in out.items():
        kind, text = params[u].grammar
        toks = [o.token_id for o in outs]
        assert_follows(path, kind, text, toks, outs[-1].finish_reason)
        if params[u].logprobs is None:
            continue
        m = reference_matcher(path, kind, text)
        for o in outs:
            assert o.logprob is not None and o.logprob > float("-inf")
            assert len(o.top_logprobs) == params[u].logprobs
            for t, lp in o.top_logprobs:
                if lp > float("-inf"):
                    assert m.fork().accept_token(t), f"top logprob token {t} is forbidden"
            assert m.accept_token(o.token_id)


def test_n_like_duplicates_share_one_compilation(path) -> None:
    s = make(path, overlap=True)
    prompt = random_prompts(1, [12], 300, seed=8)[0]
    for u in range(3):  # n = 3, greedy: three identical answers
        s.add_request(u, prompt, SamplingParams(max_tokens=16, json_schema=SCHEMA))
    for u in range(3, 6):  # n = 3 sampled, each choice its own seed
        s.add_request(u, prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=u,
                                                json_schema=SCHEMA))
    res = drain(s)
    out = {u: [o.token_id for o in outs] for u, outs in res.items()}
    assert out[0] == out[1] == out[2]
    assert len({tuple(out[u]) for u in range(3, 6)}) > 1
    for u, toks in out.items():
        assert_follows(path, "json_schema", SCHEMA, toks, res[u][-1].finish_reason)
    assert len(s.grammars.compiler._cache) == 1


@pytest.mark.parametrize("kind,text,why", [
    ("json_schema", '{"type": "foo"}', 'Unsupported type "foo"'),
    ("regex", "[a-", "Unclosed '\\['"),
    ("ebnf", "root ::= missing", 'Rule "missing" is not defined'),
])
def test_compile_failure_is_reported_for_the_request_alone(path, kind, text, why) -> None:
    s = make(path, overlap=True)
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    s.add_request(1, [5, 6, 8], SamplingParams(max_tokens=4, **{kind: text}))
    failures, outs = [], {}
    while s.has_work:
        for o in s.step():
            outs.setdefault(o.uid, []).append(o)
        failures += s.take_failures()
    ((uid, message, param, status),) = failures
    assert (uid, param, status) == (1, kind, 400)
    assert re.match(rf"{kind}: could not compile the grammar: .*{why}", message), message
    assert "/project/" not in message and ".cc:" not in message  # no C++ source location
    assert list(outs) == [0] and len(outs[0]) == 4 and 1 not in s.reqs
    s.check_integrity()


def test_llm_generate_names_the_prompt_and_field(path) -> None:
    llm = LLM(str(path), dtype="float32", device="cpu")
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12]]
    params = [SamplingParams(max_tokens=5, ignore_eos=True), SamplingParams(regex="(a"),
              SamplingParams(max_tokens=5, json_schema=SCHEMA)]
    with pytest.raises(ValueError, match=r"^prompt 1: regex: could not compile the grammar"):
        llm.generate(prompts, params)
    sched = llm.scheduler
    sched.check_integrity()
    assert not sched.has_work and sched.stats()["running"] == 0
    res = llm.generate(prompts[2:], params[2:])  # the engine goes on serving
    assert_follows(path, "json_schema", SCHEMA, res[0].token_ids, res[0].finish_reason)


def test_a_token_the_grammar_rejects_fails_that_request_alone(path, monkeypatch) -> None:
    """The safety net behind the mask: were a forbidden token ever sampled, the request fails
    (HTTP 500) instead of emitting it, and its neighbours go on."""
    s = make(path, overlap=True)
    monkeypatch.setattr(s.grammars, "mask", lambda logits, rows: [])  # a broken mask
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=8, regex="zzzz"))
    s.add_request(1, [5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
    failures, outs = [], {}
    while s.has_work:
        for o in s.step():
            outs.setdefault(o.uid, []).append(o)
        failures += s.take_failures()
    assert [(f.uid, f.param, f.status) for f in failures] == [(0, "regex", 500)]
    assert list(outs) == [1] and len(outs[1]) == 8
    s.check_integrity()


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_while_compiling_and_while_decoding(path, overlap) -> None:
    s = make(path, overlap)
    s.add_request(0, [5, 6, 7], SamplingParams(max_tokens=20, json_schema=SCHEMA))
    s.abort(0)  # still compiling (or compiled, not yet queued)
    assert not s.has_work and s.stats()["aborted_waiting"] == 1
    s.add_request(1, [5, 6, 7], SamplingParams(max_tokens=30, regex="[a-z]{40}"))
    s.add_request(2, [8, 9], SamplingParams(max_tokens=30, json_schema=SCHEMA))
    got: dict[int, list] = {}
    while len(got.get(1, [])) < 3:
        for o in s.step():
            got.setdefault(o.uid, []).append(o)
    s.abort(1)  # mid-decode, maybe in flight
    for uid, outs in drain(s).items():
        got.setdefault(uid, []).extend(outs)
    assert not got[1][-1].finished
    assert_follows(path, "json_schema", SCHEMA, [o.token_id for o in got[2]],
                   got[2][-1].finish_reason)
    assert s.take_failures() == []


def test_scheduler_process_turns_a_compile_failure_into_request_failed(path) -> None:
    import time

    import zmq

    from radixserve.messages import IpcAddresses, RequestFailed, RequestStarted, make_socket
    from radixserve.scheduler.loop import SchedulerLoop

    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    try:
        detok = make_socket(ctx, zmq.PULL, addrs.detokenizer, bind=True)
        make_socket(ctx, zmq.PULL, addrs.frontend, bind=True)
        loop = SchedulerLoop(make(path, overlap=True), ctx, addrs)
        loop.handle(UserMsg(7, [5, 6, 7], SamplingParams(max_tokens=4, ebnf="root ::= (")))
        got: list = []
        deadline = time.monotonic() + 30
        while not any(isinstance(m, RequestFailed) for m in got) and time.monotonic() < deadline:
            loop.step()
            while detok.poll(10):
                got.append(decode(detok.recv()))
        assert isinstance(got[0], RequestStarted)
        failed = next(m for m in got if isinstance(m, RequestFailed))
        assert (failed.uid, failed.param, failed.status) == (7, "ebnf", 400)
        assert failed.message.startswith("ebnf: could not compile the grammar: ")
        assert 7 not in loop.scheduler.reqs and not loop.scheduler.has_work
    finally:
        ctx.destroy(linger=0)
        addrs.remove()


@pytest.mark.slow
def test_tp2_constrained_equals_tp1(tiny_ckpts) -> None:
    path = tiny_ckpts["qwen3"]
    prompts = random_prompts(6, [3, 40, 9], 300, seed=13)
    params = [SamplingParams(max_tokens=12, ignore_eos=True) if u % 2 else
              SamplingParams(max_tokens=16, **dict([GRAMMARS[u // 2]])) for u in range(6)]
    kw = {"dtype": "float32", "device": "cpu", "max_prefill_length": 16, "page_size": 4}
    ref = LLM(str(path), **kw).generate(prompts, params)
    for u in range(0, 6, 2):
        assert_follows(path, *GRAMMARS[u // 2], ref[u].token_ids, ref[u].finish_reason)
    ref_tokens = [r.token_ids for r in ref]
    llm = LLM(str(path), tp=2, **kw)
    try:
        assert [r.token_ids for r in llm.generate(prompts, params)] == ref_tokens
        with pytest.raises(ValueError, match=r"^prompt 1: json_schema: could not compile"):
            llm.generate(prompts[:2], [params[1], SamplingParams(json_schema='{"type": 1}')])
        assert [r.token_ids for r in llm.generate(prompts, params)] == ref_tokens  # in step still
    finally:
        llm.close()
