"""Tool-call parsers and the chat-output state machine, without a server: every text is fed whole
and one character at a time (a stream's worst case), and both must give the same answer."""
from __future__ import annotations

import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from radixserve.postprocess.auto_tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    detect_tool_parser,
    parse_call,
)
from radixserve.postprocess.chat_output import ChatOutput
from radixserve.postprocess.tool_parsers import (
    CallStart,
    Content,
    NamedCallParser,
    RequiredCallsParser,
)

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'


def _run(make, text: str, chunk: int) -> tuple[str | None, list[tuple[str, dict]]]:
    """(content or None, [(name, arguments)]) from feeding `text` in pieces of `chunk` characters."""
    out = ChatOutput(make())
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)] or [""]
    for i, p in enumerate(pieces):
        out.feed(p, final=i == len(pieces) - 1)
    msg = out.message()
    return msg["content"], [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                            for c in msg.get("tool_calls", [])]


def _both(make, text: str) -> tuple[str | None, list[tuple[str, dict]]]:
    whole = _run(make, text, max(1, len(text)))
    assert _run(make, text, 1) == whole == _run(make, text, 3)
    return whole


def test_hermes_calls_amid_text() -> None:
    text = f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n" \
           '{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert _both(HermesParser, text) == ("Let me check.", [("get_weather", {"city": "Paris", "days": 3}),
                                                          ("get_time", {})])
    only = f"<tool_call>\n{WEATHER}\n</tool_call>"
    assert _both(HermesParser, only) == (None, [("get_weather", {"city": "Paris", "days": 3})])
    assert _both(lambda: HermesParser(parallel=False), text)[1] == [("get_weather", {"city": "Paris", "days": 3})]


def test_hermes_plain_text_malformed_and_unclosed() -> None:
    assert _both(HermesParser, "No tools needed: 2 < 3 and <tool is a word.\n") == \
        ("No tools needed: 2 < 3 and <tool is a word.\n", [])
    bad = '<tool_call>\n{"name": "f", "arguments": {"x": </tool_call> done'
    assert _both(HermesParser, bad) == (bad, [])
    assert _both(HermesParser, '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}') == (None, [("f", {"x": 1})])
    assert _both(HermesParser, '<tool_call>{"name": "f", "argu') == ('<tool_call>{"name": "f", "argu', [])


def test_hermes_holds_back_only_what_may_be_a_tag() -> None:
    p = HermesParser()
    assert p.feed("Hello <tool") == [Content("Hello")]  # " <tool" may begin a call
    assert p.feed("box> ok") == [Content(" <toolbox> ok")]
    assert p.feed("\n<tool_call>") == []
    ev = p.feed(WEATHER + "</tool_call>")
    assert isinstance(ev[0], CallStart) and ev[0].name == "get_weather" and ev[0].id.startswith("call_")
    assert p.finish() == []


def test_llama3_json_calls() -> None:
    one = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert _both(Llama3JsonParser, one) == (None, [("get_weather", {"city": "Paris"})])
    assert _both(Llama3JsonParser, "<|python_tag|>" + one) == (None, [("get_weather", {"city": "Paris"})])
    two = one + '; {"name": "get_time", "parameters": {"tz": "UTC"}}'
    assert _both(Llama3JsonParser, two)[1] == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]
    assert _both(lambda: Llama3JsonParser(parallel=False), two)[1] == [("get_weather", {"city": "Paris"})]


def test_llama3_text_and_non_calls_are_content() -> None:
    assert _both(Llama3JsonParser, "  Paris is in France. {\"a\": 1}") == ("  Paris is in France. {\"a\": 1}", [])
    assert _both(Llama3JsonParser, '{"a": 1} trailing') == ('{"a": 1} trailing', [])
    assert _both(Llama3JsonParser, '{"name": "f", "parameters": {') == ('{"name": "f", "parameters": {', [])
    p = Llama3JsonParser()
    assert p.feed("Sure") == [Content("Sure")]  # plain text streams at once


def test_required_calls_are_sent_whole() -> None:
    text = '[ {"name": "get_weather", "parameters": {"city": "P\\"aris [x]", "days": 3}} ,\n' \
           '{"parameters": {"tz": "UTC"}, "name": "get_time"}, {"name": "s", "parameters": "a b"}]'
    assert _both(RequiredCallsParser, text) == (None, [
        ("get_weather", {"city": 'P"aris [x]', "days": 3}), ("get_time", {"tz": "UTC"}), ("s", "a b")])
    p = RequiredCallsParser()
    assert p.feed('[{"name": "f", "parameters": {"a"') == []  # not yet a call
    events = p.feed(': 1}}, {"na')
    assert [type(e).__name__ for e in events] == ["CallStart", "CallArgs"] and events[1].text == '{"a": 1}'


def test_named_call_is_the_whole_output() -> None:
    assert _both(lambda: NamedCallParser("f"), ' \n{"q": [1, {"r": "}"}]}\n ') == (None, [("f", {"q": [1, {"r": "}"}]})])
    assert _both(lambda: NamedCallParser("f"), "42") == (None, [("f", 42)])
    assert NamedCallParser("f").feed('{"a": 1') == []  # not yet a call


@pytest.mark.parametrize("make, text, content, calls", [
    (lambda: NamedCallParser("f"), '{"', '{"', []),
    (lambda: NamedCallParser("f"), ' {"city": "Par', ' {"city": "Par', []),
    (lambda: NamedCallParser("f"), "tru", "tru", []),
    (RequiredCallsParser, '[{"name": "f", "parameters": {', '[{"name": "f", "parameters": {', []),
    (RequiredCallsParser, '[{"name": "f", "parameters": {}}, {"name": "g"', ', {"name": "g"', [("f", {})]),
    (RequiredCallsParser, '[{"name": "f", "parameters": {}}', None, [("f", {})]),
])
def test_output_cut_before_a_call_is_complete_is_content(make, text: str, content: str | None, calls: list) -> None:
    """max_tokens ended the output mid-call: what is not a complete call is content, streamed or not."""
    assert _both(make, text) == (content, calls)
    out = ChatOutput(make())
    deltas = [d for ch in text for d in out.feed(ch)] + out.feed("", final=True)
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]] \
        == [name for name, _ in calls]
    assert out.finish_reason("length") == "length"


def test_parse_call_and_detection() -> None:
    assert parse_call(WEATHER) == ("get_weather", '{"city": "Paris", "days": 3}')
    assert parse_call('{"name": 3}') is None and parse_call("[1]") is None and parse_call('{"name": "f", "arguments": [1]}') is None
    assert detect_tool_parser("{{- '<tool_call>\\n' }}") == "hermes"
    assert detect_tool_parser("{{- '<|python_tag|>' }}") == "llama3"
    assert detect_tool_parser("{% for message in messages %}{{ message['content'] }}{% endfor %}") is None
    assert detect_tool_parser({"default": "x", "tool_use": "<tool_call>"}) == "hermes"
    assert detect_tool_parser(None) is None


def _chunks(deltas: list[dict], finish: str) -> list[ChatCompletionChunk]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    out = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    out += [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
    out.append({"index": 0, "delta": {}, "finish_reason": finish})
    return [ChatCompletionChunk.model_validate(head | {"choices": [c]}) for c in out]


@pytest.mark.parametrize("make, text", [
    (HermesParser, f"<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n" + '{"name": "t", "arguments": {}}</tool_call>'),
    (RequiredCallsParser, '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "t", "parameters": {}}]'),
    (lambda: NamedCallParser("get_weather"), '{"city": "Paris", "days": [1, 2]}'),
])
def test_stream_deltas_accumulate_in_the_openai_client(make, text: str) -> None:
    out = ChatOutput(make())
    deltas = [d for ch in text for d in out.feed(ch)] + out.feed("", final=True)
    starts = [d["tool_calls"][0] for d in deltas if "id" in d["tool_calls"][0]]
    assert all(s["function"]["arguments"] == "" and s["type"] == "function" for s in starts)
    state = ChatCompletionStreamState()
    for chunk in _chunks(deltas, out.finish_reason("stop")):
        state.handle_chunk(chunk)
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert final.message.content is None or final.message.content == ""
    got = [tc.model_dump(include={"id", "type", "function"}) for tc in final.message.tool_calls]
    assert [{**c, "function": {k: v for k, v in c["function"].items() if k in ("name", "arguments")}} for c in got] == out.message()["tool_calls"]


def test_output_without_calls_keeps_the_engine_reason() -> None:
    out = ChatOutput(HermesParser())
    assert out.feed("Hi there ", final=False) == [{"content": "Hi there"}]
    assert out.feed("", final=True) == [{"content": " "}]  # no call: trailing space is content
    assert out.message() == {"role": "assistant", "content": "Hi there "}
    assert out.finish_reason("length") == "length" and out.finish_reason("stop") == "stop"

