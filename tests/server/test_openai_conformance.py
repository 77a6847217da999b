"""OpenAI-API conformance: the OpenAI-API tests of SGLang (`test/srt/openai_server/`) and vLLM
(`tests/entrypoints/openai/`) that apply to this server, rewritten against the embedded
SmolLM2-135M served for real and used through the official `openai` client (one server for the
module). They check the API's shapes and rules, never what a 135M model knows: outputs that must
be exact are greedy and compared with each other, constrained ones are judged by `jsonschema`
or `re`. The upstream tests that do not apply are listed in docs/api.md ("Conformance")."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.server_process import ServerProcess

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASK = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
NAME = {"type": "string", "maxLength": 10}
CITY = {"type": "object", "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The current time.",
                                         "parameters": {"type": "object", "properties": {}}}}
EMPLOYEE = {"type": "object", "additionalProperties": False, "required": ["name", "age", "skills"],
            "properties": {"name": NAME, "age": {"type": "integer", "minimum": 18, "maximum": 70},
                           "skills": {"type": "array", "items": {"enum": ["python", "sql", "go"]}, "maxItems": 2}}}


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory):
    srv = ServerProcess(None, tmp_path_factory.mktemp("conformance") / "server.log", "--tool-call-parser", "hermes")
    srv.wait_ready(timeout=300)
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def client(smol) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smol.base}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _post(smol, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{smol.base}{path}", json=body, timeout=300)


def _tokens(smol, text: str) -> int:
    return _post(smol, "/tokenize", {"prompt": text}).json()["count"]


def _concurrently(*calls):
    """Run the calls at once (the engine batches them); their results in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def _bad_request(call) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    return e.value


class Burst:
    """The module's longest generations, sent all at once when a test first asks for one, so the
    engine batches them: the module then takes about as long as the longest, not their sum. Each
    test judges its own answers (a failed call raises in the test that reads it)."""

    def __init__(self, calls: dict[str, Callable[[], Any]]) -> None:
        self.pool = ThreadPoolExecutor(len(calls))
        self.futures = {name: self.pool.submit(call) for name, call in calls.items()}

    def __getitem__(self, name: str) -> Any:
        return self.futures[name].result()


@pytest.fixture(scope="module")
def burst(smol, client, model):
    b = Burst(_structured_calls(client, model) | _json_mode_calls(client, model) | _generate_calls(smol)
              | _tool_calls(client, model) | _pydantic_calls(client, model) | _events_calls(client, model)
              | _round_trip_calls(client, model))
    yield b
    b.pool.shutdown()


# --- models (SGLang test_openai_server: test_model_list, test_retrieve_model; vLLM test_basic) ---

def test_models_list_and_retrieve(smol, client, model) -> None:
    cards = list(client.models.list())
    assert len(cards) == 1 and isinstance(cards[0].max_model_len, int)
    card = client.models.retrieve(model)
    assert (card.id, card.root, card.object) == (model, model, "model")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("non-existent-model")
    assert httpx.get(f"{smol.base}/version", timeout=30).json()["version"]


# --- completions (SGLang run_completion[_stream]; vLLM test_completion) ---

@pytest.mark.parametrize("echo, logprobs, n, token_input", [
    (False, None, 1, False), (True, 3, 2, True), (False, 3, 1, True), (True, None, 2, False)])
def test_completion_matrix(smol, client, model, echo: bool, logprobs: int | None, n: int, token_input: bool) -> None:
    """Two prompts (list input), text or token ids: one choice per prompt and n, the prompt's
    tokens counted once per prompt; echo and logprobs in both the whole and the streamed answer."""
    text = "The capital of France is"
    prompt = _post(smol, "/tokenize", {"prompt": text}).json()["tokens"] if token_input else text
    kw = {"model": model, "prompt": [prompt, prompt], "max_tokens": 6, "temperature": 0, "echo": echo, "logprobs": logprobs, "n": n}
    r, chunks = _concurrently(lambda: client.completions.create(**kw),
                              lambda: list(client.completions.create(**kw, stream=True,
                                                                     stream_options={"include_usage": True})))
    assert len(r.choices) == 2 * n and [c.index for c in r.choices] == list(range(2 * n))
    assert r.usage.prompt_tokens == 2 * _tokens(smol, text) and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    for c in r.choices:
        assert c.text.startswith(text) if echo else not c.text.startswith(text)
        if logprobs:
            lp = c.logprobs
            assert isinstance(lp.tokens[0], str) and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
            assert (lp.token_logprobs[0] is None) == echo and (lp.top_logprobs[0] is None) == echo
            assert all(1 <= len(top) <= logprobs + 1 for top in lp.top_logprobs[1 if echo else 0:])
        else:
            assert c.logprobs is None
    streamed = [""] * (2 * n)
    for ch in chunks[:-1]:
        assert ch.id and ch.created and ch.usage is None and len(ch.choices) == 1
        streamed[ch.choices[0].index] += ch.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    assert streamed == [c.text for c in r.choices]  # greedy: the same text, echo included


def test_completion_logprobs_counts(client, model) -> None:
    """vLLM's test_{no,zero,some,too_many}_completion_logprobs: the chosen token is always among
    `top_logprobs` (k + 1 entries at most), `logprobs: 0` gives it alone; over 20 is a 400, also
    streamed, and the server serves on."""
    kw = {"model": model, "prompt": [0, 0, 0, 0, 0], "max_tokens": 4, "temperature": 0}
    none, zero, five = _concurrently(*(lambda k=k: client.completions.create(**kw, logprobs=k) for k in (None, 0, 5)))
    assert none.choices[0].logprobs is None
    for r, k in ((zero, 0), (five, 5)):
        lp = r.choices[0].logprobs
        assert all(max(k, 1) <= len(top) <= k + 1 for top in lp.top_logprobs)
        assert all(tok in top and top[tok] == v for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    for stream in (False, True):
        _bad_request(lambda s=stream: list(client.completions.create(**kw, logprobs=21, stream=s)) if s
                     else client.completions.create(**kw, logprobs=21))
    assert client.completions.create(**kw).choices[0].text is not None


def test_completion_usage_and_stream_equal_non_stream(smol, client, model) -> None:
    """vLLM's test_single_completion / test_completion_streaming: exact usage with its
    prompt_tokens_details, one finish_reason in a stream, the streamed text the whole one."""
    kw = {"model": model, "prompt": "Hello, my name is", "max_tokens": 5, "temperature": 0, "extra_body": {"ignore_eos": True}}
    r = client.completions.create(**kw)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == _tokens(smol, "Hello, my name is")
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    chunks = list(client.completions.create(**kw, stream=True))
    assert sum(c.choices[0].finish_reason is not None for c in chunks) == 1
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_batch_of_prompts_streamed(client, model) -> None:
    """vLLM's test_batch_completions: a list of equal prompts, text or token ids, gives equal
    greedy texts; streamed, each chunk holds one choice."""
    for prompts in (["Hello, my name is"] * 2, [[0, 0, 0, 0, 0]] * 2):
        texts = [""] * 2
        for ch in client.completions.create(model=model, prompt=prompts, max_tokens=5, temperature=0, stream=True):
            assert len(ch.choices) == 1
            texts[ch.choices[0].index] += ch.choices[0].text
        assert texts[0] == texts[1]


# --- chat (SGLang run_chat_completion[_stream]; vLLM test_chat) ---

@pytest.mark.parametrize("logprobs", [None, 5])
def test_chat_n_and_logprobs(client, model, logprobs: int | None) -> None:
    kw = {"model": model, "messages": ASK, "max_tokens": 8, "temperature": 0.7, "seed": 3, "n": 2,
              "logprobs": logprobs is not None, "top_logprobs": logprobs}
    r = client.chat.completions.create(**kw)
    assert len(r.choices) == 2 and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    if logprobs:
        assert all(len(t.top_logprobs) == logprobs for c in r.choices for t in c.logprobs.content)
    first, finishes = {}, {}
    for ch in client.chat.completions.create(**kw, stream=True):
        c = ch.choices[0]
        if c.index not in first:
            first[c.index] = c.delta.role
            continue
        if c.finish_reason is not None:
            finishes[c.index] = finishes.get(c.index, 0) + 1
        elif logprobs:
            assert len(c.logprobs.content[0].top_logprobs) == logprobs
    assert first == {0: "assistant", 1: "assistant"} and finishes == {0: 1, 1: 1}


def test_chat_logprobs_counts(client, model) -> None:
    """vLLM's test_{no,zero,some,too_many}_logprobs_chat."""
    kw = {"model": model, "messages": ASK, "max_completion_tokens": 4, "temperature": 0}
    off, zero, five = _concurrently(lambda: client.chat.completions.create(**kw, logprobs=False),
                                    lambda: client.chat.completions.create(**kw, logprobs=True, top_logprobs=0),
                                    lambda: client.chat.completions.create(**kw, logprobs=True, top_logprobs=5))
    assert off.choices[0].logprobs is None
    assert {len(t.top_logprobs) for t in zero.choices[0].logprobs.content} == {0}
    assert {len(t.top_logprobs) for t in five.choices[0].logprobs.content} == {5}
    _bad_request(lambda: client.chat.completions.create(**kw, logprobs=True, top_logprobs=21))
    _bad_request(lambda: list(client.chat.completions.create(**kw, logprobs=True, top_logprobs=30, stream=True)))


def test_chat_session_stream_equals_non_stream(client, model) -> None:
    """vLLM's test_single_chat_session and test_chat_streaming; the content given as text parts
    is the same conversation (test_complex_message_content), and an unknown field of a message
    is ignored (test_extra_fields_allowed)."""
    kw = {"model": model, "max_completion_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
    r = client.chat.completions.create(messages=ASK, **kw)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    parts = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": ASK[1]["content"]}], "extra_field": "0"}]
    as_parts = client.chat.completions.create(messages=parts, **kw)
    assert as_parts.choices[0].message.content == r.choices[0].message.content
    chunks = list(client.chat.completions.create(messages=ASK, stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert sum(c.choices[0].finish_reason is not None for c in chunks) == 1
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    turn = ASK + [{"role": "assistant", "content": r.choices[0].message.content},
                  {"role": "user", "content": "Say it in JSON."}]
    assert client.chat.completions.create(messages=turn, frequency_penalty=1.0, **kw).choices[0].message.content
    # SGLang's test_response_prefill: the reply continues the assistant's last message
    prefill = ASK + [{"role": "assistant", "content": "{\n"}]
    kw["extra_body"] |= {"continue_final_message": True, "add_generation_prompt": False}
    assert client.chat.completions.create(messages=prefill, **kw).choices[0].finish_reason == "length"


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_stream_options(client, model, route: str) -> None:
    """vLLM's test_*_stream_options and SGLang's test_continuous_usage_stats: no usage unless
    asked; include_usage: one last chunk of usage without choices; with continuous_usage_stats
    every chunk (the opening one too) carries the counts so far, never falling; stream_options
    without stream is a 400."""
    if route == "chat":
        def create(**kw):
            return client.chat.completions.create(model=model, messages=ASK, max_tokens=6, temperature=0, **kw)
    else:
        def create(**kw):
            return client.completions.create(model=model, prompt="The capital of France is", max_tokens=6,
                                             temperature=0, **kw)
    plain, last, every = _concurrently(
        lambda: list(create(stream=True, stream_options={"include_usage": False, "continuous_usage_stats": True})),
        lambda: list(create(stream=True, stream_options={"include_usage": True})),
        lambda: list(create(stream=True, extra_body={"min_tokens": 6},
                            stream_options={"include_usage": True, "continuous_usage_stats": True})))
    assert all(c.usage is None for c in plain)
    assert all(c.usage is None for c in last[:-1]) and last[-1].choices == []
    assert last[-1].usage.total_tokens == last[-1].usage.prompt_tokens + last[-1].usage.completion_tokens > 0
    seen = 0
    for c in every:
        assert c.usage is not None and c.usage.prompt_tokens > 0
        assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
        assert c.usage.completion_tokens > seen or (c.usage.completion_tokens == seen and (seen == 0 or not c.choices))
        seen = c.usage.completion_tokens
    assert seen == 6 and every[-1].choices == []
    for options in ({"include_usage": True}, {"continuous_usage_stats": True}):
        err = _bad_request(lambda o=options: create(stream=False, stream_options=o))
        assert err.body["param"] == "stream_options"


def test_seed_out_of_range_and_n(client, model) -> None:
    """vLLM's test_long_seed and test_chat_completion_n_*: a seed past 64 bits is a 400; n gives
    n choices, indexed, each with content."""
    for seed in (-(2**63) - 1, 2**63):
        _bad_request(lambda s=seed: client.chat.completions.create(model=model, messages=ASK, seed=s, max_tokens=2))
    r = client.chat.completions.create(model=model, messages=ASK, max_completion_tokens=6, temperature=0.8, n=3,
                                       seed=42, extra_body={"min_tokens": 1})
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.message.content for c in r.choices)


# --- prefix cache report (SGLang test_cache_report; vLLM --enable-prompt-tokens-details) ---

def test_cached_tokens_are_reported_everywhere(smol, client, model) -> None:
    """A prompt sent again is served from the prefix cache but its last token; every route
    reports it as OpenAI does (chat, completions, their streams, Responses, /generate)."""
    unique = "€ A question no other test asks: how many sparrows lift a coconut?"
    msgs = [{"role": "user", "content": unique}]
    first = client.chat.completions.create(model=model, messages=msgs, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model=model, messages=msgs, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - 1
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    streamed = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=2, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    resp = client.responses.create(model=model, input=unique, max_output_tokens=2)
    assert resp.usage.input_tokens_details.cached_tokens == resp.usage.input_tokens - 1
    text = "_ " + unique
    cold = client.completions.create(model=model, prompt=text, max_tokens=2)
    warm = client.completions.create(model=model, prompt=text, max_tokens=2)
    assert cold.usage.prompt_tokens_details.cached_tokens < warm.usage.prompt_tokens_details.cached_tokens \
        == warm.usage.prompt_tokens - 1
    meta = _post(smol, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 2}}).json()["meta_info"]
    assert meta["cached_tokens"] == meta["prompt_tokens"] - 1


# --- stops (SGLang test_matched_stop) ---

def test_matched_stop(smol, client, model) -> None:
    """What ended a "stop" answer: the stop string, or the token (EOS); none for "length"."""
    prompt = "The capital of France is"
    greedy = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True}).choices[0].text
    stop = greedy[len(greedy) // 2:][:3]  # (the greedy answer is the same again: it holds the stop string)
    eos = _post(smol, "/tokenize", {"prompt": "<|im_end|>", "add_special_tokens": False}).json()["tokens"]
    assert len(eos) == 1, eos
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
    by_string, cut, by_token = _concurrently(
        lambda: _post(smol, "/v1/completions", body | {"stop": stop, "ignore_eos": True}).json()["choices"][0],
        lambda: _post(smol, "/v1/completions", body | {"max_tokens": 2, "ignore_eos": True}).json()["choices"][0],
        lambda: _post(smol, "/v1/chat/completions", {"messages": ASK, "max_tokens": 8,
                                                     "logit_bias": {str(eos[0]): 100}}).json()["choices"][0])
    assert (by_string["finish_reason"], by_string["matched_stop"]) == ("stop", stop), (stop, by_string)
    assert (cut["finish_reason"], cut["matched_stop"]) == ("length", None)
    assert (by_token["finish_reason"], by_token["matched_stop"]) == ("stop", eos[0])


# --- context length (SGLang test_request_length_validation; vLLM test_prompt_validation) ---

def test_context_length_errors_name_the_field(smol, client, model) -> None:
    limit = client.models.retrieve(model).max_model_len
    long = "hello " * (limit + 100)
    e = _bad_request(lambda: client.chat.completions.create(model=model, messages=[{"role": "user", "content": long}]))
    assert (e.code, e.param) == ("context_length_exceeded", "messages") and str(limit) in e.message
    e = _bad_request(lambda: client.completions.create(model=model, prompt=long, max_tokens=1))
    assert (e.code, e.param) == ("context_length_exceeded", "prompt")
    e = _bad_request(lambda: client.chat.completions.create(model=model, messages=ASK, max_tokens=limit))
    assert (e.code, e.param) == ("context_length_exceeded", "max_tokens")
    e = _bad_request(lambda: client.responses.create(model=model, input=long, max_output_tokens=1))
    assert (e.code, e.param) == ("context_length_exceeded", "input")
    # refused by its characters, before it is tokenized: named as the route names it too
    huge = "a" * 3_000_000
    for call, param in ((lambda: client.responses.create(model=model, input=huge), "input"),
                        (lambda: client.completions.create(model=model, prompt=huge), "prompt"),
                        (lambda: client.chat.completions.create(model=model, messages=[{"role": "user", "content": huge}]),
                         "messages")):
        e = _bad_request(call)
        assert (e.code, e.param) == ("context_length_exceeded", param) and "characters" in e.message


# --- structured outputs (SGLang test_json_constrained / test_json_mode / regex; vLLM test_chat) ---

CHOICES = ["Python", "Java", "Rust", "C++"]
IP = r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)"
SGLANG_REGEX = r'\{\n   "name": "[\w]{1,10}",\n   "population": [\d]{1,7}\n\}'


def _structured_calls(client, model) -> dict[str, Callable[[], str]]:
    msgs = [SYSTEM, {"role": "user", "content": "The best language for safe systems programming is"}]

    # seeded: a free string or JSON object sampled at 0.7 can run past any budget (one draw in
    # twelve for json_object); a seed keeps each call to one draw, whatever it is batched with
    def chat(extra: dict, tokens: int = 40) -> Callable[[], str]:
        def call() -> str:
            r = client.chat.completions.create(model=model, messages=msgs, max_tokens=tokens, temperature=0.7,
                                               seed=4, logprobs=True, top_logprobs=5, extra_body=extra)
            assert r.choices[0].finish_reason == "stop", r
            # vLLM's test_structured_outputs_choice_chat_logprobs: the tokens the grammar excludes
            # have OpenAI's floor, never -inf (not JSON)
            assert all(top.logprob >= -9999.0 for t in r.choices[0].logprobs.content for top in t.top_logprobs)
            return r.choices[0].message.content
        return call

    return {"so.choice": chat({"structured_outputs": {"choice": CHOICES}}),
            "so.guided_choice": chat({"guided_choice": CHOICES}),
            "so.json": chat({"structured_outputs": {"json": EMPLOYEE}}, 80),
            "so.guided_json": chat({"guided_json": json.dumps(EMPLOYEE)}, 80),
            "so.regex": chat({"structured_outputs": {"regex": IP}}),
            "so.guided_regex": chat({"guided_regex": IP}),
            "so.grammar": chat({"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}}),
            "so.guided_grammar": chat({"guided_grammar": 'root ::= "yes" | "no"'}),
            "so.json_object": chat({"structured_outputs": {"json_object": True}}, 120),
            "so.sglang_regex": chat({"regex": SGLANG_REGEX}),  # SGLang's test_regex
            "so.sglang_ebnf": chat({"ebnf": 'root ::= "Hello" | "Hi" | "Hey"'})}  # SGLang's test_ebnf


def test_vllm_structured_outputs_and_guided_fields(burst) -> None:
    """vLLM's structured_outputs (choice, json, regex, grammar, json_object) and its older
    guided_* fields constrain the output as response_format does; SGLang's regex and ebnf too."""
    assert burst["so.choice"] in CHOICES and burst["so.guided_choice"] in CHOICES
    for key in ("so.json", "so.guided_json"):
        jsonschema.validate(json.loads(burst[key]), EMPLOYEE)
    assert re.fullmatch(IP, burst["so.regex"]) and re.fullmatch(IP, burst["so.guided_regex"])
    assert burst["so.grammar"] in ("yes", "no") and burst["so.guided_grammar"] in ("yes", "no")
    assert isinstance(json.loads(burst["so.json_object"]), dict)
    city = json.loads(burst["so.sglang_regex"])
    assert isinstance(city["name"], str) and isinstance(city["population"], int)
    assert burst["so.sglang_ebnf"] in ("Hello", "Hi", "Hey")


def test_structured_outputs_errors(client, model) -> None:
    """vLLM's test_structured_outputs_type_error / test_invalid_{json_schema,regex,grammar}: each
    a 400 naming the field, as are two constraints at once and options this server cannot honour."""
    bad_schema = {"type": "object", "properties": {"car_type": {"$ref": "#/$defs/CarType"}, "foo": "bar"},
                  "$defs": {"CarType": {"enum": ["sedan", "SUV"]}}}
    cases = [({"structured_outputs": {"regex": {"1": "Python"}}}, "structured_outputs.regex"),
             ({"structured_outputs": {"json": bad_schema}}, "structured_outputs.json"),
             ({"structured_outputs": {"regex": "[.*"}, "stop": ["\n"]}, "structured_outputs.regex"),
             ({"structured_outputs": {"grammar": "root ::= select_statementinvalidsyntax"}}, "structured_outputs.grammar"),
             ({"guided_json": "{not json"}, "guided_json"),
             ({"guided_choice": ["a"], "regex": "b"}, "guided_choice"),
             ({"structured_outputs": {"choice": ["a"], "regex": "b"}}, "structured_outputs.choice"),
             ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
             ({"structured_outputs": {"whatever": 1}}, "structured_outputs.whatever")]
    for extra, param in cases:
        e = _bad_request(lambda x=extra: client.completions.create(model=model, prompt="Hi", max_tokens=4, extra_body=x))
        assert e.param == param, (extra, e.body)


FORMAT = {"type": "json_schema", "json_schema": {"name": "employee", "schema": EMPLOYEE}}


def _json_mode_calls(client, model) -> dict[str, Callable[[], Any]]:
    msgs = [{"role": "system", "content": "You are a helpful AI assistant that gives a short answer."},
            {"role": "user", "content": "Describe an employee."}]
    kw = {"model": model, "messages": msgs, "max_tokens": 80, "temperature": 0}
    return {"json.whole": lambda: client.chat.completions.create(**kw, response_format=FORMAT),
            "json.streamed": lambda: list(client.chat.completions.create(**kw, response_format=FORMAT, stream=True)),
            "json.text": lambda: client.chat.completions.create(**kw | {"max_tokens": 4}, response_format={"type": "text"}),
            "json.object": lambda: list(client.chat.completions.create(
                **kw | {"max_tokens": 120}, response_format={"type": "json_object"}, stream=True))}


def test_json_mode_and_schema(burst) -> None:
    """SGLang's test_json_mode / test_json_openai and vLLM's test_response_format_*: json_object
    and json_schema, whole and streamed; response_format text constrains nothing."""
    whole, streamed, mode = burst["json.whole"], burst["json.streamed"], burst["json.object"]
    jsonschema.validate(json.loads(whole.choices[0].message.content), EMPLOYEE)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == whole.choices[0].message.content
    assert mode[-1].choices[0].finish_reason == "stop"
    assert isinstance(json.loads("".join(c.choices[0].delta.content or "" for c in mode)), dict)
    assert burst["json.text"].choices[0].message.content is not None


def _generate_calls(smol) -> dict[str, Callable[[], Any]]:
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[\\w]{1,10}$"},
                                               "population": {"type": "integer", "minimum": 0, "maximum": 99999}},
              "required": ["name", "population"], "additionalProperties": False}
    body = {"text": "Introduce the capital of France as JSON:", "stream": False, "return_logprob": False,
            "top_logprobs_num": 0, "logprob_start_len": -1, "rid": "sgl-1",
            "sampling_params": {"temperature": 0.5, "max_new_tokens": 64, "n": 2, "stop_token_ids": [119690],
                                "json_schema": json.dumps(schema), "min_new_tokens": 0, "sampling_seed": 7,
                                "spaces_between_special_tokens": True, "no_stop_trim": False}}
    plain = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    batch = {"input_ids": [[504, 3458, 282], [504, 3458]], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    return {f"gen.{name}": lambda b=b: _post(smol, "/generate", b).json()
            for name, b in (("json", body), ("plain", plain), ("batch", batch))}


def test_sglang_generate_dialect(smol, burst) -> None:
    """SGLang's /generate body, as its tests and gateway send it (JSONConstrainedMixin,
    test_cache_report): sampling_params under SGLang's names, n, a batch, a JSON schema as text
    (one that is not JSON is a 400), the logprob options at their defaults; meta_info in the answer."""
    results, one, batched = burst["gen.json"], burst["gen.plain"], burst["gen.batch"]
    assert [r["meta_info"]["prompt_tokens"] for r in batched] == [3, 2]  # a batch: one result per prompt
    assert isinstance(results, list) and len(results) == 2
    for r in results:
        obj = json.loads(r["text"])
        assert isinstance(obj["name"], str) and isinstance(obj["population"], int)
        assert r["meta_info"]["finish_reason"]["type"] == "stop" and r["meta_info"]["prompt_tokens"] > 0
    assert results[0]["meta_info"]["id"] != results[1]["meta_info"]["id"]
    assert one["meta_info"]["finish_reason"] == {"type": "length", "length": 5} and len(one["output_ids"]) == 5
    assert one["meta_info"]["completion_tokens"] == 5 and one["finish_reason"] == "length"
    for sampling, param in (({"json_schema": "INVALID"}, "json_schema"),
                            ({"max_new_tokens": 4, "max_tokens": 4}, "sampling_params.max_new_tokens"),
                            ({"no_stop_trim": True}, "sampling_params.no_stop_trim"),
                            ({"stop_regex": "a|b"}, "sampling_params.stop_regex")):
        r = _post(smol, "/generate", {"text": "x", "sampling_params": sampling})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = _post(smol, "/generate", {"text": "x", "return_logprob": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_logprob"


def test_unsupported_extensions_are_refused(client, model) -> None:
    """A vLLM or SGLang field this server cannot honour is a 400 naming it, never ignored with a
    200; at its neutral value it is accepted (vLLM's clients send their defaults)."""
    for extra in ({"use_beam_search": True}, {"prompt_logprobs": 1}, {"return_token_ids": True},
                  {"include_stop_str_in_output": True}, {"bad_words": ["x"]}, {"cache_salt": "s"},
                  {"stop_regex": "and|or"}, {"functions": [{"name": "f"}]}, {"echo": True}):
        e = _bad_request(lambda x=extra: client.chat.completions.create(model=model, messages=ASK, max_tokens=2,
                                                                        extra_body=x))
        assert e.param == next(iter(extra)) and "not supported" in e.message
    e = _bad_request(lambda: client.completions.create(model=model, prompt="x", max_tokens=2, suffix="!"))
    assert e.param == "suffix"
    neutral = {"use_beam_search": False, "include_stop_str_in_output": False, "spaces_between_special_tokens": True,
               "bad_words": [], "echo": False, "add_special_tokens": False, "stream_interval": 1, "user": "u"}
    assert client.chat.completions.create(model=model, messages=ASK, max_tokens=2, extra_body=neutral).choices


# --- tool calls (SGLang test_openai_function_calling, test_tool_choice; vLLM test_completion_with_function_calling) ---

def _tool_calls(client, model) -> dict[str, Callable[[], Any]]:
    msgs = [{"role": "user", "content": "What is the weather like in Paris?"}]
    kw = {"model": model, "messages": msgs, "max_tokens": 80, "temperature": 0.8, "tools": [WEATHER, TIME],
          "parallel_tool_calls": False}
    named = {"type": "function", "function": {"name": "get_weather"}}
    return {"tools.required": lambda: client.chat.completions.create(**kw, tool_choice="required"),
            "tools.named": lambda: client.chat.completions.create(**kw, tool_choice=named),
            "tools.streamed": lambda: list(client.chat.completions.create(**kw, tool_choice="required", n=2,
                                                                           stream=True)),
            "tools.none": lambda: list(client.chat.completions.create(**kw | {"max_tokens": 8}, tool_choice="none",
                                                                       stream=True)),
            "tools.auto": lambda: list(client.chat.completions.create(**kw | {"max_tokens": 8}, tool_choice="auto",
                                                                       stream=True)),
            "tools.named_streamed": lambda: list(client.chat.completions.create(**kw, tool_choice=named, stream=True))}


def test_required_and_named_calls(burst) -> None:
    required, named, streamed = burst["tools.required"], burst["tools.named"], burst["tools.streamed"]
    none, auto, named_streamed = burst["tools.none"], burst["tools.auto"], burst["tools.named_streamed"]
    calls = required.choices[0].message.tool_calls
    assert len(calls) == 1 and required.choices[0].finish_reason == "tool_calls"  # parallel_tool_calls false
    assert all(c.function.name in ("get_weather", "get_time") and isinstance(json.loads(c.function.arguments), dict)
               for c in calls)
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), CITY)
    finishes = {}
    for ch in streamed:
        for c in ch.choices:
            if c.finish_reason is not None:
                finishes.setdefault(c.index, []).append(c.finish_reason)
    assert finishes == {0: ["tool_calls"], 1: ["tool_calls"]}
    assert not any(c.choices[0].delta.tool_calls for c in none)
    assert none[-1].choices[0].finish_reason in ("stop", "length")
    assert auto[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    # vLLM's test_named_tool_use, streamed: no content, one finish_reason, the arguments whole JSON
    assert all(not c.choices[0].delta.content for c in named_streamed)
    assert sum(c.choices[0].finish_reason is not None for c in named_streamed) == 1
    args = "".join(t.function.arguments or "" for c in named_streamed for t in c.choices[0].delta.tool_calls or [])
    jsonschema.validate(json.loads(args), CITY)


class Options(BaseModel):
    unit: str = Field(json_schema_extra={"enum": ["celsius", "fahrenheit"]})
    days: int = Field(ge=1, le=7)


class Forecast(BaseModel):
    city: str = Field(max_length=10)
    options: Options


def _pydantic_calls(client, model) -> dict[str, Callable[[], Any]]:
    tools = [openai.pydantic_function_tool(Forecast, name="forecast"), TIME]
    msgs = [{"role": "user", "content": "The forecast for Berlin for 3 days, in celsius?"}]
    return {f"pydantic.{name}": lambda c=choice: client.chat.completions.create(
        model=model, messages=msgs, tools=tools, tool_choice=c, max_tokens=80, temperature=0, parallel_tool_calls=False)
        for name, choice in (("required", "required"), ("named", {"type": "function", "function": {"name": "forecast"}}))}


def test_pydantic_tools_with_defs_under_required(burst) -> None:
    """openai.pydantic_function_tool writes nested models as `$defs` and `$ref`: tool_choice
    "required" must compile them (vLLM's WeatherOptions tool), as named choice and
    response_format do."""
    required, named = burst["pydantic.required"], burst["pydantic.named"]
    for r in (required, named):
        assert r.choices[0].finish_reason == "tool_calls", r
        for call in r.choices[0].message.tool_calls:
            if call.function.name == "forecast":
                Forecast.model_validate_json(call.function.arguments)
    assert named.choices[0].message.tool_calls[0].function.name == "forecast"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_cut_by_max_tokens_is_no_call(client, model, tool_choice) -> None:
    """vLLM's test_max_tokens_with_tool_choice_required, chat and Responses: finish_reason
    "length", no tool call (what was cut is content), the stream saying the same."""
    msgs = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    for max_tokens in (1, 5):
        kw = {"model": model, "messages": msgs, "tools": [WEATHER], "tool_choice": tool_choice, "max_tokens": max_tokens,
                  "temperature": 0}
        whole = client.chat.completions.create(**kw).choices[0]
        assert whole.finish_reason == "length" and not whole.message.tool_calls and whole.message.content
        chunks = [c.choices[0] for c in client.chat.completions.create(**kw, stream=True)]
        assert not any(c.delta.tool_calls for c in chunks) and chunks[-1].finish_reason == "length"
        assert "".join(c.delta.content or "" for c in chunks) == whole.message.content
    responses_choice = tool_choice if isinstance(tool_choice, str) else {"type": "function", "name": "get_weather"}
    r = client.responses.create(model=model, input=msgs, max_output_tokens=5, temperature=0,
                                tools=[{"type": "function", **WEATHER["function"]}], tool_choice=responses_choice)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert all(item.type != "function_call" for item in r.output)


def test_tool_choice_errors_and_history(client, model) -> None:
    """vLLM's test_inconsistent_tool_choice_and_tools (400s) and test_no_args_tool_call (a call
    with `{}` or empty arguments given back as history)."""
    def create(**kw):
        return client.chat.completions.create(model=model, messages=ASK, max_tokens=4, **kw)

    _bad_request(lambda: create(tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    _bad_request(lambda: create(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}))
    _bad_request(lambda: create(tools=[WEATHER], tool_choice={}))
    for arguments in ("{}", ""):
        history = [{"role": "user", "content": "What time is it?"},
                   {"role": "assistant", "content": None,
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": arguments}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
        r = client.chat.completions.create(model=model, messages=history, tools=[TIME], max_tokens=8)
        assert r.choices[0].message.content is not None


# --- Responses (SGLang TestOpenAIServerv1Responses, test_responses_function_calling; vLLM responses/) ---

def test_responses_shapes(smol, client, model) -> None:
    r = client.responses.create(model=model, input="The capital of France is", temperature=0, max_output_tokens=8,
                                metadata={"k": "v"}, store=True, extra_body={"frequency_penalty": 1.0})
    assert r.object == "response" and r.id and r.created_at and r.error is None and r.metadata == {"k": "v"}
    assert r.status in ("completed", "incomplete") and (r.incomplete_details is None) == (r.status == "completed")
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens and r.text.format.type == "text"
    events = list(client.responses.create(model=model, input="The capital of France is", max_output_tokens=8,
                                          stream=True))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1].response
    assert events[-1].type == f"response.{final.status}" and final.usage.input_tokens > 0
    assert final.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
    bad = _post(smol, "/v1/responses", {"model": model, "input": "Hi", "previous_response_id": "bad"})
    assert bad.status_code == 400 and set(bad.json()["error"]) == {"message", "type", "param", "code"}


RESPONSES_TOOLS = [{"type": "function", **WEATHER["function"], "strict": True}]
PARIS = [{"role": "user", "content": "What's the weather like in Paris today?"}]


def _round_trip_calls(client, model) -> dict[str, Callable[[], Any]]:
    return {"round_trip.call": lambda: client.responses.create(
        model=model, input=PARIS, tools=RESPONSES_TOOLS, max_output_tokens=60, temperature=0,
        tool_choice={"type": "function", "name": "get_weather"})}


def test_responses_function_call_round_trip(client, model, burst) -> None:
    """vLLM's test_named_tool_use and test_replayed_input_items: the output items given back as
    input (the SDK's own objects, a reasoning item among them), then the call's output."""
    tools, items, r = RESPONSES_TOOLS, list(PARIS), burst["round_trip.call"]
    call = next(item for item in r.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments)["city"]
    items += [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Call the tool."}],
               "encrypted_content": None}, call,
              {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 20 C."}]
    again = client.responses.create(model=model, input=items, tools=tools, max_output_tokens=16, temperature=0)
    assert again.status in ("completed", "incomplete") and again.output
    e = _bad_request(lambda: client.responses.create(model=model, input=[{"type": "item_reference", "id": "msg_1"}]))
    assert "item_reference" in e.message
    # SGLang's test_tool_choice_none: tools shown to the model, no call parsed
    none = client.responses.create(model=model, input=items[:1], tools=tools, tool_choice="none", max_output_tokens=8)
    assert all(item.type != "function_call" for item in none.output)


def _events_calls(client, model) -> dict[str, Callable[[], Any]]:
    tools = [{"type": "function", **TIME["function"]}]
    return {f"events.{name}": lambda kw=kw: list(client.responses.create(
        model=model, input="What time is it?", max_output_tokens=16, temperature=0, stream=True, **kw))
        for name, kw in (("text", {}), ("call", {"tools": tools, "tool_choice": {"type": "function", "name": "get_time"}}))}


def test_responses_stream_events_pair_up(burst) -> None:
    """vLLM's test_function_calling_with_streaming_types: each `.done` closes what its `.added`
    (or its deltas) opened, the stream ends with nothing open, and a forced call's argument
    deltas add up to its item's arguments."""
    for name in ("events.text", "events.call"):
        opened: list[str] = []
        args = ""
        for event in burst[name]:
            kind, base = event.type, event.type.rsplit(".", 1)[0]
            if kind == "response.created":
                opened.append("response")
            elif kind.endswith(".added"):
                opened.append(base)
            elif kind.endswith(".delta"):
                args += event.delta if base == "response.function_call_arguments" else ""
                if opened[-1] != base:
                    opened.append(base)
            elif kind.endswith(".done"):
                assert opened.pop() == base, kind
                if kind == "response.output_item.done" and event.item.type == "function_call":
                    assert event.item.arguments == args
                    args = ""
            elif kind in ("response.completed", "response.incomplete"):
                assert opened.pop() == "response"
        assert opened == []
    assert any(e.type == "response.function_call_arguments.done" for e in burst["events.call"])
