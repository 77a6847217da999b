"""`tools` / `tool_choice` / `response_format` → grammar, template input and parser, without a
server; and a tool conversation through a Qwen 2.5-style chat template (the real template's tool
parts), as the tokenizer process renders it."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from radixserve.messages import TokenizeMsg, decode, encode
from radixserve.sampling_params import SamplingParams
from radixserve.server.errors import APIError
from radixserve.server.protocol import ChatCompletionRequest, CompletionRequest
from radixserve.server.structured_output import request_constraint
from radixserve.server.tools import plan_tools, required_calls_schema
from radixserve.testing import build_tokenizer
from radixserve.tokenizer.tokenize import TokenizeManager

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "get_time"}}
USER = [{"role": "user", "content": "hi"}]


def _chat(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER} | kw)


def _error(fn, *args) -> APIError:
    with pytest.raises(APIError) as e:
        fn(*args)
    assert e.value.status == 400
    return e.value


def test_required_schema_accepts_calls_and_nothing_else() -> None:
    req = _chat(tools=[WEATHER, NOW])
    schema = required_calls_schema(req.tools, parallel=True)
    jsonschema.validate([{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}], schema)
    for bad in ([], [{"name": "get_weather", "parameters": {}}], [{"name": "nope", "parameters": {}}],
                [{"name": "get_time", "parameters": {}, "extra": 1}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    one = required_calls_schema(req.tools, parallel=False)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_time", "parameters": {}}] * 2, one)


def test_required_schema_keeps_each_functions_local_refs() -> None:
    """What `openai.pydantic_function_tool` writes for a nested model: `$defs` at the top of the
    parameters and `#/$defs/...` references, and a recursive `#` one; the grammar of `required`
    must resolve each within its own function."""
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int
        y: int

    class Path(BaseModel):
        start: Point
        end: Point

    tree = {"type": "object", "properties": {"label": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["label", "kids"], "additionalProperties": False}
    tools = [openai.pydantic_function_tool(Path, name="draw"),
             {"type": "function", "function": {"name": "tree", "parameters": tree}}]
    schema = required_calls_schema(_chat(tools=tools).tools, parallel=True)
    good = [{"name": "draw", "parameters": {"start": {"x": 1, "y": 2}, "end": {"x": 3, "y": 4}}},
            {"name": "tree", "parameters": {"label": "a", "kids": [{"label": "b", "kids": []}]}}]
    jsonschema.validate(good, schema)
    for bad in ([{"name": "draw", "parameters": {"start": {"x": 1}, "end": {"x": 3, "y": 4}}}],
                [{"name": "tree", "parameters": {"label": "a", "kids": [{"label": 1, "kids": []}]}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    # and xgrammar, the engine's compiler, resolves them alike
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    assert _is_grammar_accept_string(grammar, json.dumps(good))
    assert not _is_grammar_accept_string(grammar, json.dumps(good[:1] + [{"name": "draw", "parameters": {}}]))


def test_plans() -> None:
    assert plan_tools(_chat(), "hermes").mode == "none"
    auto = plan_tools(_chat(tools=[WEATHER]), "hermes")
    assert auto.mode == "auto" and auto.parser == "hermes" and not auto.forced
    assert json.loads(auto.tools_json) == [WEATHER]
    assert plan_tools(_chat(tools=[WEATHER], tool_choice="none"), "hermes").tools_json is not None  # the template still sees them
    req = plan_tools(_chat(tools=[WEATHER, NOW], tool_choice="required", parallel_tool_calls=False), None)
    assert req.constraint.kind == "json_schema" and json.loads(req.constraint.value)["maxItems"] == 1
    assert req.constraint.names == {"json_schema": "tools"}
    named = plan_tools(_chat(tools=[WEATHER, NOW], tool_choice={"type": "function", "function": {"name": "get_weather"}}), None)
    assert json.loads(named.constraint.value) == WEATHER["function"]["parameters"] and named.function == "get_weather"
    assert json.loads(plan_tools(_chat(tools=[NOW], tool_choice={"type": "function", "function": {"name": "get_time"}}),
                                 None).constraint.value) == {"type": "object", "properties": {}}


def test_plan_errors_name_the_field() -> None:
    assert _error(plan_tools, _chat(tool_choice="required"), None).param == "tool_choice"
    assert _error(plan_tools, _chat(tools=[WEATHER, WEATHER]), None).param == "tools"
    bad = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"type": "integr"}}}}}
    assert _error(plan_tools, _chat(tools=[NOW, bad]), None).param == "tools.1.function.parameters"
    named = {"type": "function", "function": {"name": "other"}}
    assert _error(plan_tools, _chat(tools=[WEATHER], tool_choice=named), None).param == "tool_choice.function.name"


def test_request_constraints() -> None:
    assert request_constraint(_chat()) is None
    assert request_constraint(_chat(response_format={"type": "text"})) is None
    c = request_constraint(_chat(response_format={"type": "json_object"}))
    assert (c.kind, json.loads(c.value), c.field) == ("json_schema", {"type": "object"}, "response_format")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    c = request_constraint(CompletionRequest.model_validate({"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}}))
    assert json.loads(c.value) == schema and c.names == {"json_schema": "response_format.json_schema.schema"}
    assert request_constraint(_chat(regex="[0-9]+")) == ("regex", "[0-9]+", "regex")
    assert request_constraint(_chat(ebnf='root ::= "a"')).kind == "ebnf"
    assert _error(request_constraint, _chat(regex="a", ebnf='root ::= "a"')).param == "ebnf"
    assert _error(request_constraint, _chat(response_format={"type": "json_schema"})).param == "response_format.json_schema"
    bad = _chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objec"}}})
    e = _error(request_constraint, bad)
    assert e.param == "response_format.json_schema.schema" and "/type" in e.message


# The tool parts of Qwen 2.5's template, verbatim in what they read: `tools` one JSON line each, a
# call's `arguments | tojson` (a map, or a string gets quoted), the tool's reply as user content.
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{%- if message.content %}\n{{ message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "\n<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_a_tool_conversation_reaches_the_template_as_transformers_passes_it() -> None:
    from radixserve.server.openai_api import chat_messages

    req = _chat(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], tools=[WEATHER, NOW])
    plan = plan_tools(req, "hermes")
    msg = decode(encode(TokenizeMsg(1, SamplingParams(), chat=chat_messages(req.messages), tools=plan.tools_json)))
    tokenizer = build_tokenizer()
    tokenizer.chat_template = QWEN_LIKE
    text = tokenizer.decode(TokenizeManager(tokenizer).tokenize(msg))
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text  # a map, as the template wants
    assert '{"name": "get_time", "arguments": "not json"}' in text  # not JSON: the string as sent
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert json.dumps(WEATHER["function"]["parameters"])[:20] in text and '"name": "get_time"' in text
    assert text.endswith("<|im_start|>assistant")


def test_message_rules() -> None:
    from radixserve.server.openai_api import chat_messages

    def _chat_messages(req):
        return chat_messages(req.messages)

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert _error(_chat_messages, _chat(messages=[{"role": "user", "content": "x", "tool_calls": [call]}])).param == "messages.0.tool_calls"
    assert _error(_chat_messages, _chat(messages=[{"role": "tool", "content": "x"}])).param == "messages.0.tool_call_id"
    out = _chat_messages(_chat(messages=[{"role": "assistant", "tool_calls": [call]}]))
    assert out == [{"role": "assistant", "content": "", "tool_calls": [call]}]
