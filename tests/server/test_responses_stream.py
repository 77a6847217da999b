"""The `/v1/responses` event stream of an answer that writes text, then calls functions (a Hermes
tool parser under `tool_choice: auto`), fed a few characters at a time: the message item closes
before each call's item opens, every call's argument deltas add up to its arguments, and the final
response is the non-streamed one. (The embedded model's forced calls are in
test_structured_output.py; this is the text-then-calls order no grammar forces there.)"""
from __future__ import annotations

import asyncio
import json
import types

from radixserve.messages.types import UserReply
from radixserve.server.protocol import ResponsesRequest
from radixserve.server.responses_api import _output, _Shape, _status, _stream
from radixserve.server.tools import ToolPlan

CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]
TEXT = "Let me check." + "".join(
    f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>' for n, a in CALLS)


class _Replies:
    """A `Dispatch` whose one choice replies TEXT three characters at a time."""

    async def events(self, first, raw):
        pieces = [TEXT[i:i + 3] for i in range(0, len(TEXT), 3)]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            yield 0, UserReply(uid=0, text=piece, token_ids=[1], finished=last,
                               finish_reason="stop" if last else None, prompt_tokens=5, completion_tokens=i + 1)


def _events(shape: _Shape, plan: ToolPlan) -> list[dict]:
    async def run() -> list[str]:
        return [e async for e in _stream(_Replies(), None, None, shape, plan.new_output())]
    return [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(run())]


def test_text_then_calls_stream_as_items_in_order() -> None:
    req = ResponsesRequest.model_validate({"input": "Weather?", "tools": [
        {"type": "function", "name": "get_weather"}, {"type": "function", "name": "get_time"}]})
    plan = ToolPlan("auto", "[]", parser="hermes")
    shape = _Shape(types.SimpleNamespace(model_name="m"), req)
    events = _events(shape, plan)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in added] == [i["type"] for i in done] == ["message", "function_call", "function_call"]
    kinds = [e["type"] for e in events if e["type"].startswith("response.output_item.")]
    assert kinds == ["response.output_item.added", "response.output_item.done"] * 3  # one item open at a time
    assert done[0]["content"][0]["text"] == "Let me check."
    for item, (name, args) in zip(done[1:], CALLS):
        assert item["name"] == name and json.loads(item["arguments"]) == args and item["status"] == "completed"
        deltas = [e["delta"] for e in events
                  if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == item["id"]]
        assert "".join(deltas) == item["arguments"]
        (fin,) = [e for e in events if e["type"] == "response.function_call_arguments.done" and e["item_id"] == item["id"]]
        assert fin["arguments"] == item["arguments"] and fin["output_index"] == done.index(item)
    assert len({i["call_id"] for i in done[1:]}) == 2
    final = events[-1]
    assert final["type"] == "response.completed" and final["response"]["output"] == done
    out = plan.new_output()
    out.feed(TEXT, final=True)
    shape.call_ids.clear()  # the non-streamed output names its items afresh: compare all but ids
    plain = _output(shape, out, _status("stop"))
    strip = [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in done]
    assert [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in plain] == strip


def test_input_items_become_the_chat_conversation() -> None:
    """An assistant's text and the calls after it are one assistant turn; each output is the
    tool message answering its call; tools and a named choice take chat's shape."""
    from radixserve.server.responses_api import _chat_request

    req = ResponsesRequest.model_validate({
        "instructions": "Be brief.", "tool_choice": {"type": "function", "name": "f"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "input": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a": 1}'},
                  {"type": "function_call_output", "call_id": "c1", "output": "one"},
                  {"type": "function_call_output", "call_id": "c2", "output": "two"}]})
    chat = _chat_request(req)
    got = [m.model_dump(exclude_none=True) for m in chat.messages]
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert got == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", **call}, {"id": "c2", **call, "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"}]
    assert [t.model_dump(exclude_none=True) for t in chat.tools] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert chat.tool_choice.function.name == "f"


def test_replayed_output_items_are_taken_back_as_input() -> None:
    """A response's whole output given back as `input`, as the SDK returns it (a reasoning item,
    an assistant message with annotated `output_text`, a call): the thinking is its assistant
    turn's `reasoning_content`; an item of a type this server does not take is a 400 saying so."""
    from pydantic import ValidationError

    from radixserve.server.errors import _validation
    from radixserve.server.responses_api import _chat_request

    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None,
                 "content": [{"type": "reasoning_text", "text": "They want the time."}]}
    message = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}]}
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}", "status": "completed"}
    req = ResponsesRequest.model_validate({"input": [{"role": "user", "content": "Time?"}, reasoning, message, call,
                                                     {"type": "function_call_output", "call_id": "c1", "output": "noon"},
                                                     {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Answer."}]},
                                                     {"role": "assistant", "content": "Noon."}]})
    got = [m.model_dump(exclude_none=True) for m in _chat_request(req).messages]
    assert got[1] == {"role": "assistant", "content": "Checking.", "reasoning_content": "They want the time.",
                      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert got[3] == {"role": "assistant", "content": "Noon.", "reasoning_content": "Answer."}
    try:
        ResponsesRequest.model_validate({"input": [{"type": "item_reference", "id": "msg_1"}]})
    except ValidationError as e:
        err = _validation(e)
    assert err.param == "input.0" and "item_reference" in err.message and "reasoning" in err.message


def test_forced_calls_cut_by_max_tokens_stream_as_their_whole_response() -> None:
    """`required`, its second call cut by max_tokens: the first call, then the cut text as a
    message, status incomplete; streamed in the same order as the whole response lists them."""
    from radixserve.server.protocol import ChatCompletionRequest
    from radixserve.server.tools import plan_tools

    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "f", "parameters": {"a'
    chat = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    plan = plan_tools(chat, None)
    shape = _Shape(types.SimpleNamespace(model_name="m"), ResponsesRequest.model_validate({"input": "x"}))

    class Cut:
        async def events(self, first, raw):
            for i in range(0, len(text), 4):
                last = i + 4 >= len(text)
                yield 0, UserReply(uid=0, text=text[i:i + 4], token_ids=[1], finished=last,
                                   finish_reason="length" if last else None, prompt_tokens=5, completion_tokens=i + 1)

    async def run() -> list[str]:
        return [e async for e in _stream(Cut(), None, None, shape, plan.new_output())]
    events = [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(run())]
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    assert [i["type"] for i in final["output"]] == ["function_call", "message"]
    assert final["output"][1]["content"][0]["text"] == ', {"name": "f", "parameters": {"a'
    out = plan.new_output()
    out.feed(text, final=True)
    whole = _output(shape, out, _status("length"), plan.forced)
    strip = ("id", "call_id")
    assert [{k: v for k, v in i.items() if k not in strip} for i in whole] == \
        [{k: v for k, v in i.items() if k not in strip} for i in final["output"]]
