"""Structured outputs and tool calls through the official `openai` client, with the embedded
SmolLM2-135M (one server for the module). Every answer is judged by `jsonschema`, never by eye:
whatever the model samples, the grammar must make it valid. Requests run concurrently (the engine
batches them) and every round is sent twice, the second with the radix cache warm. Strings are
bounded (`maxLength`, enums) so a 135M model always finishes within `max_tokens`."""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.server_process import ServerProcess

SYSTEM = {"role": "system", "content": "You are a precise assistant. Answer only with the data asked for."}
MAX_TOKENS = 160  # above the longest output any schema here allows, however it is tokenized


def _obj(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required,
            "additionalProperties": False}


NAME = {"type": "string", "maxLength": 8}
SCHEMAS = {
    "person": _obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    "enums, one optional": _obj({"color": {"enum": ["red", "green", "blue"]}, "shade": {"enum": ["light", "dark"]}}, ["color"]),
    "nested object, optional field": _obj({"user": _obj({"id": {"type": "integer", "minimum": -5, "maximum": 99},
                                                    "active": {"type": "boolean"}}, ["id"]),
                                          "role": {"type": "string", "enum": ["admin", "guest"]}}),
    "integer array": _obj({"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
                                      "minItems": 1, "maxItems": 3}}),
    "exactly two tags": _obj({"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 2}}),
    "array of objects": _obj({"items": {"type": "array", "minItems": 1, "maxItems": 2, "items": _obj(
        {"sku": {"type": "string", "maxLength": 4}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
    "top-level array": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 3},
    "pattern": _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
    "anyOf and const": _obj({"kind": {"const": "event"}, "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                                          {"enum": ["none"]}]}}),
    "$defs and $ref": {"$defs": {"point": _obj({"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                "y": {"type": "integer", "minimum": 0, "maximum": 9}})},
                       **_obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}})},
}
WEATHER = {"name": "get_weather", "description": "The forecast for a city.", "parameters": _obj(
    {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
     "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city", "days"])}
SEARCH = {"name": "search", "description": "Search the web.", "parameters": _obj(
    {"query": {"type": "string", "maxLength": 12}, "limit": {"type": "integer", "minimum": 1, "maximum": 5}})}
MEETING = {"name": "book_meeting", "parameters": _obj({"meeting": _obj(
    {"title": NAME, "people": {"type": "array", "items": NAME, "maxItems": 2}})})}
NOW = {"name": "get_time", "description": "The current time."}  # no parameters
FUNCTIONS = [WEATHER, SEARCH, MEETING, NOW]
TOOLS = [{"type": "function", "function": f} for f in FUNCTIONS]


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory):
    """SmolLM2's template has no tool format: Hermes parsing (`tool_choice: auto`) is asked for;
    and Qwen3's reasoning split, which must leave every output without a `<think>` block alone."""
    srv = ServerProcess(None, tmp_path_factory.mktemp("structured") / "server.log", "--tool-call-parser", "hermes",
                        "--reasoning-parser", "qwen3")
    srv.wait_ready(timeout=300)
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def client(smol) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smol.base}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _concurrently(calls: list) -> list:
    """Run the calls (no arguments) at once: the engine batches them."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def _chat(client, model: str, stream: bool, **kw) -> list[dict]:
    """Each choice as {"content", "tool_calls", "finish_reason"}, streamed or not; a stream is
    accumulated by the client's own helper."""
    kw = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0.7, "seed": 5, "n": 2} | kw
    if not stream:
        r = client.chat.completions.create(**kw)
    else:
        with client.chat.completions.stream(**kw) as s:
            for _ in s:
                pass
            r = s.get_final_completion()
    out = []
    for c in sorted(r.choices, key=lambda c: c.index):
        calls = [{"id": t.id, "type": t.type, "name": t.function.name, "arguments": t.function.arguments}
                 for t in c.message.tool_calls or []]
        out.append({"content": c.message.content, "tool_calls": calls, "finish_reason": c.finish_reason,
                    "reasoning": getattr(c.message, "reasoning_content", None)})
    assert len(out) == kw["n"]
    return out


def _not_streamed_then_streamed(smol, make_call, cases: list, extra: list | None = None) -> None:
    """Every case without streaming, then again streamed: the second round finds each prompt in the
    radix cache. `make_call(case, stream)` is a call that checks its own answer."""
    hits = [_prefix_hits(smol)]
    for stream in (False, True):
        _concurrently([make_call(c, stream) for c in cases] + ((extra or []) if not stream else []))
        hits.append(_prefix_hits(smol))
    prompts = len(cases)
    assert hits[2] - hits[1] >= prompts * 20, f"the streamed round found too few cached tokens: {hits}"


def _prefix_hits(smol) -> float:
    time.sleep(1.5)  # counters come with the scheduler's periodic stats
    return smol.metrics().get("radixserve_prefix_cache_hit_tokens_total", 0.0)


def test_every_schema_validates_streaming_and_not_n2_warm(client, model, smol) -> None:
    def call(item, stream: bool):
        name, schema = item
        msgs = [SYSTEM, {"role": "user", "content": f"Give me JSON for: {name}."}]
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}

        def run() -> None:
            for c in _chat(client, model, stream, messages=msgs, response_format=fmt):
                assert c["finish_reason"] == "stop", (name, c)
                jsonschema.validate(json.loads(c["content"]), schema)
        return run

    _not_streamed_then_streamed(smol, call, list(SCHEMAS.items()), [lambda: _pydantic_parse(client, model),
                                                                    lambda: _json_object(client, model)])


class City(BaseModel):
    name: str = Field(max_length=8)
    country: str = Field(max_length=8)
    population_millions: int = Field(ge=0, le=40)


def _pydantic_parse(client, model: str) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "Describe Paris."}]
    parsed = client.chat.completions.parse(model=model, messages=msgs, response_format=City, max_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, City)


def _json_object(client, model: str) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "Give me an empty JSON object."}]
    r = client.chat.completions.create(model=model, messages=msgs, response_format={"type": "json_object"},
                                       max_tokens=24, temperature=0)
    # any object: only max_tokens bounds it, so either it ended or it ran out inside the object
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")


def _check_calls(choice: dict, functions: list[dict], content: str | None = None) -> None:
    assert choice["finish_reason"] == "tool_calls" and choice["content"] == content, choice
    assert len(choice["tool_calls"]) == 1, choice  # parallel_tool_calls false, or one call forced
    by_name = {f["name"]: f.get("parameters", {"type": "object", "properties": {}}) for f in functions}
    for call in choice["tool_calls"]:
        assert call["id"].startswith("call_") and call["type"] == "function"
        jsonschema.validate(json.loads(call["arguments"]), by_name[call["name"]])


def test_required_and_named_tool_calls_are_valid(client, model, smol) -> None:
    question = {"role": "user", "content": "What will the weather be in Tokyo for the next three days?"}

    def call(choice, stream: bool):
        called = FUNCTIONS if choice == "required" else [f for f in FUNCTIONS if f["name"] == choice["function"]["name"]]

        def run() -> None:
            for c in _chat(client, model, stream, messages=[SYSTEM, question], tools=TOOLS, tool_choice=choice,
                           parallel_tool_calls=False):
                _check_calls(c, called)
        return run

    choices = ["required"] + [{"type": "function", "function": {"name": f["name"]}} for f in (WEATHER, MEETING, NOW)]
    _not_streamed_then_streamed(smol, call, choices)


def test_auto_parses_the_models_hermes_calls_and_none_does_not(client, model) -> None:
    """A regex makes the model write a Hermes call (SmolLM2 has no tool format of its own)."""
    call = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|London)", "days": [1-7]\}\}\n</tool_call>'
    msgs = [SYSTEM, {"role": "user", "content": "Weather in Paris?"}]

    def auto(stream: bool):
        def run() -> None:
            for c in _chat(client, model, stream, messages=msgs, tools=TOOLS, n=1, extra_body={"regex": r"Ok\.\n" + call}):
                _check_calls(c, FUNCTIONS, content="Ok.")
        return run

    def none(stream: bool):
        def run() -> None:
            for c in _chat(client, model, stream, messages=msgs, tools=TOOLS, n=1, tool_choice="none",
                           extra_body={"regex": call}):
                assert c["tool_calls"] == [] and c["content"].startswith("<tool_call>\n{") and c["finish_reason"] == "stop"
        return run

    _concurrently([f(stream) for f in (auto, none) for stream in (False, True)])


def test_regex_ebnf_and_native_generate(client, model, smol) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "Is Paris in France?"}]
    regex = r"(Yes|No), [a-z]{2,8}\."
    ebnf = 'root ::= "The capital of France is " city "."\ncity ::= "Paris" | "Lyon" | "Nice"'
    year = r" (19|20)[0-9]{2}\."

    def chat_regex(stream: bool):
        def run() -> None:
            for c in _chat(client, model, stream, messages=msgs, extra_body={"regex": regex}):
                assert re.fullmatch(regex, c["content"]) and c["finish_reason"] == "stop", c
        return run

    def completion_ebnf() -> None:
        r = client.completions.create(model=model, prompt="Q: What is the capital of France?\nA:", max_tokens=32,
                                      temperature=0.7, n=2, extra_body={"ebnf": ebnf})
        assert all(re.fullmatch(r"The capital of France is (Paris|Lyon|Nice)\.", c.text) for c in r.choices), r.choices

    def completion_regex_streamed() -> None:
        chunks = list(client.completions.create(model=model, prompt="The year is", max_tokens=16, temperature=0.7,
                                                stream=True, extra_body={"regex": year}))
        assert re.fullmatch(year, "".join(c.choices[0].text for c in chunks))

    def native_schema() -> None:  # /generate takes the schema as JSON text
        schema = _obj({"a": {"enum": [1, 2]}, "b": {"type": "boolean"}})
        r = httpx.post(f"{smol.base}/generate", timeout=300, json={"text": "JSON:", "sampling_params": {
            "max_tokens": 32, "temperature": 0.7, "json_schema": json.dumps(schema)}}).json()
        assert r["finish_reason"] == "stop", r
        jsonschema.validate(json.loads(r["text"]), schema)

    _concurrently([chat_regex(False), chat_regex(True), completion_ebnf, completion_regex_streamed, native_schema])


def test_tool_result_turn_is_accepted(client, model) -> None:
    args = '{"city": "Paris", "days": 1}'
    msgs = [SYSTEM, {"role": "user", "content": "Weather in Paris tomorrow?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sunny", "high_c": 24}'}]
    r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
    shorter = client.chat.completions.create(model=model, messages=msgs[:2], tools=TOOLS, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens > shorter.usage.prompt_tokens + 10  # the tool turn reached the template


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"minLength": -1}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"regex": "a+"}}, "regex"),
    ({"extra_body": {"regex": "(unclosed"}}, "regex"),  # only the grammar compiler knows
    ({"extra_body": {"ebnf": "root ::= undefined_rule"}}, "ebnf"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]}, "tools.0.function.parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
]


@pytest.mark.parametrize("kw, param", BAD, ids=[p for _, p in BAD])
def test_invalid_constraint_is_400_naming_the_field(client, model, kw: dict, param: str) -> None:
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           stream=stream, **kw)
        assert e.value.body["param"] == param, e.value.body


def test_reasoning_block_is_split_from_the_answer(client, model) -> None:
    """`--reasoning-parser qwen3`: a regex makes SmolLM2 think as Qwen3 does; the block comes back
    as `reasoning_content` (streamed deltas accumulated by the client), the rest as `content`,
    and other outputs carry no reasoning."""
    msgs = [SYSTEM, {"role": "user", "content": "Capital of France?"}]
    thought = r"<think>\n(The capital is Paris|I know this one)\.\n</think>\n\n(Paris|It is Paris)\."

    def run(stream: bool):
        def check() -> None:
            for c in _chat(client, model, stream, messages=msgs, extra_body={"regex": thought}):
                assert c["reasoning"] in ("The capital is Paris.\n", "I know this one.\n"), c
                assert c["content"] in ("Paris.", "It is Paris."), c
            for c in _chat(client, model, stream, messages=msgs, extra_body={"regex": r"(Yes|No)\."}):
                assert c["reasoning"] is None and c["content"] in ("Yes.", "No."), c
        return check

    _concurrently([run(False), run(True)])
    # the reply goes back as history, reasoning_content included (as the client dumps it)
    reply = client.chat.completions.create(model=model, messages=msgs, max_tokens=40,
                                           extra_body={"regex": thought}).choices[0].message
    history = msgs + [reply.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
    assert "reasoning_content" in history[-2]
    assert client.chat.completions.create(model=model, messages=history, max_tokens=4).choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="only assistant messages carry reasoning_content"):
        client.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": "Hi", "reasoning_content": "hm"}])


def test_responses_text_format_follows_the_schema(client, model) -> None:
    """`/v1/responses`' `text.format` is the chat route's `response_format`: every answer valid,
    streamed or not, and echoed back in the response's `text`; a bad schema is a 400 naming it."""
    def answers(name: str) -> None:
        schema = SCHEMAS[name]
        fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
        kw = {"model": model, "instructions": SYSTEM["content"], "input": f"Give me a {name}.",
              "max_output_tokens": MAX_TOKENS, "temperature": 0.7, "text": {"format": fmt}}
        r = client.responses.create(**kw)
        jsonschema.validate(json.loads(r.output_text), schema)
        assert r.status == "completed" and r.text.format.type == "json_schema"
        with client.responses.stream(**kw) as s:
            final = s.get_final_response()
        jsonschema.validate(json.loads(final.output_text), schema)

    _concurrently([lambda n=name: answers(n) for name in ("person", "integer array", "$defs and $ref")])
    # json_object bounds nothing, so the object may run past the limit: a prefix of one then
    r = client.responses.create(model=model, input="Any JSON object.", max_output_tokens=MAX_TOKENS,
                                text={"format": {"type": "json_object"}}, extra_body={"top_k": 1})
    assert r.output_text.lstrip().startswith("{") and r.text.format.type == "json_object"
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input="hi", max_output_tokens=4, text={"format": {
            "type": "json_schema", "name": "bad", "schema": {"type": "object", "properties": 3}}})
    assert e.value.body["param"] == "text.format.schema", e.value.body


def _response_calls(r) -> list[tuple[str, str]]:
    return [(o.name, o.arguments) for o in r.output if o.type == "function_call"]


def test_responses_function_calls_equal_chats(client, model) -> None:
    """`/v1/responses` with `tools` (the Responses shape: the definition beside `type`): forced
    calls come back as `function_call` items equal to chat's `tool_calls` for the same
    conversation (greedy), streamed through the SDK helper and not, with their arguments valid;
    the call's result, given back as `function_call_output`, is the chat's tool turn."""
    question = "What will the weather be in Tokyo for the next three days?"
    for choice, chat_choice in (("required", "required"),
                                ({"type": "function", "name": "get_weather"},
                                 {"type": "function", "function": {"name": "get_weather"}})):
        chat = client.chat.completions.create(
            model=model, messages=[SYSTEM, {"role": "user", "content": question}], tools=TOOLS,
            tool_choice=chat_choice, parallel_tool_calls=False, max_tokens=MAX_TOKENS, temperature=0)
        assert chat.choices[0].finish_reason == "tool_calls"
        want = [(c.function.name, c.function.arguments) for c in chat.choices[0].message.tool_calls]
        kw = {"model": model, "instructions": SYSTEM["content"], "input": question,
              "tools": [{"type": "function", **f} for f in FUNCTIONS], "tool_choice": choice,
              "parallel_tool_calls": False, "max_output_tokens": MAX_TOKENS, "temperature": 0}
        r = client.responses.create(**kw)
        assert _response_calls(r) == want and r.status == "completed", r.output
        assert all(o.type == "function_call" and o.call_id.startswith("call_") for o in r.output)
        jsonschema.validate(json.loads(want[0][1]), next(f for f in FUNCTIONS if f["name"] == want[0][0])["parameters"])
        assert [t.name for t in r.tools] == [f["name"] for f in FUNCTIONS]
        with client.responses.stream(**kw) as s:
            events = list(s)
            final = s.get_final_response()
        assert _response_calls(final) == want
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert deltas == "".join(a for _, a in want)
        assert [e.sequence_number for e in events] == list(range(len(events)))
    args = '{"city": "Paris", "days": 1}'
    result = '{"forecast": "sunny", "high_c": 24}'
    chat = client.chat.completions.create(model=model, tools=TOOLS, max_tokens=8, temperature=0, messages=[
        SYSTEM, {"role": "user", "content": "Weather in Paris tomorrow?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result}])
    r = client.responses.create(model=model, instructions=SYSTEM["content"], max_output_tokens=8, temperature=0,
                                tools=[{"type": "function", **f} for f in FUNCTIONS], input=[
        {"role": "user", "content": "Weather in Paris tomorrow?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
        {"type": "function_call_output", "call_id": "call_1", "output": result}])
    assert r.output_text == chat.choices[0].message.content and r.usage.input_tokens == chat.usage.prompt_tokens


@pytest.mark.parametrize("kw,param", [
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}]}, "tools.0.parameters"),
    ({"tools": [{"type": "function", **WEATHER}], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", **WEATHER}], "tool_choice": "required",
      "text": {"format": {"type": "json_object"}}}, "text.format"),
])
def test_responses_bad_tools_are_400_naming_the_field(client, model, kw: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input="hi", max_output_tokens=4, **kw)
    assert e.value.body["param"] == param, e.value.body
