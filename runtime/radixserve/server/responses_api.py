"""`/v1/responses`: OpenAI's Responses API, for text and function tools. The input (a string, or
items: messages whose content is a string or text parts, earlier `function_call`s and their
`function_call_output`s) goes through the chat template like a chat request, with `instructions`
as the system message first; the answer comes back as a `message` output item, after a
`reasoning` item holding the thinking when the server runs a `--reasoning-parser`, and one
`function_call` item per call. `tools`, `tool_choice` and `parallel_tool_calls` work as on the
chat route (server/tools.py), and `text.format` constrains the text as chat's `response_format`.
Streamed, it is the Responses event sequence (`response.created` ... `response.completed`, each
event with its `sequence_number`). Nothing is stored, so `previous_response_id`, `background`
and `conversation` are refused with a 400 rather than silently ignored."""
from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from radixserve.postprocess.chat_output import ChatOutput
from radixserve.server.dispatch import Choice, Dispatch, Prompt
from radixserve.server.errors import APIError, error_body
from radixserve.server.extensions import refuse_unsupported
from radixserve.server.json_body import ParsedJsonRoute
from radixserve.server.openai_api import (
    build_params,
    chat_messages,
    check_model,
    output_grammar,
    requested_adapter,
    template_options,
)
from radixserve.server.protocol import (
    ChatCompletionRequest,
    ResponseFunctionCall,
    ResponseFunctionCallOutput,
    ResponseReasoningItem,
    ResponsesRequest,
    SamplingFields,
)
from radixserve.server.state import ServerState, StateDep
from radixserve.server.structured_output import ANY_JSON_OBJECT, Constraint, schema_constraint
from radixserve.server.tools import plan_tools

router = APIRouter(route_class=ParsedJsonRoute)


_REFUSED = {
    "previous_response_id": "this server stores no responses: send the whole conversation as `input`",
    "conversation": "this server stores no conversations: send the whole conversation as `input`",
    "background": "background responses are not supported",
}


_CHAT_SAMPLING = frozenset(SamplingFields.model_fields) - {
    "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options"}


def _chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    for name, why in _REFUSED.items():
        if getattr(req, name) not in (None, False, []):
            raise APIError(400, f"{name}: {why}", name)
    messages: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        thinking: str | None = None  # a reasoning item's text, for the assistant turn after it
        for m in req.input:
            if isinstance(m, ResponseReasoningItem):
                parts = m.content if m.content is not None else m.summary
                thinking = (thinking or "") + "".join(p.text for p in parts)
                continue
            if isinstance(m, ResponseFunctionCall):  # calls after an assistant's text: one turn
                call = {"id": m.call_id, "type": "function",
                        "function": {"name": m.name, "arguments": m.arguments}}
                if messages and messages[-1]["role"] == "assistant":  # the same turn's text or calls
                    messages[-1].setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(m, ResponseFunctionCallOutput):
                messages.append({"role": "tool", "tool_call_id": m.call_id, "content": m.output})
            else:
                content = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)
                messages.append({"role": m.role, "content": content})
            if thinking is not None and messages[-1]["role"] == "assistant":
                messages[-1]["reasoning_content"], thinking = thinking, None
    # vLLM's way: the chat's other sampling fields (top_k, seed, stop, ignore_eos, ...) as extras
    extras = {k: v for k, v in (req.model_extra or {}).items() if k in _CHAT_SAMPLING}
    fields: dict[str, Any] = extras | {"model": req.model, "messages": messages, "stream": req.stream,
                                       "parallel_tool_calls": req.parallel_tool_calls}
    if req.tools is not None:  # chat's shape: the definition under `function`
        fields["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                           for t in req.tools]
    if isinstance(req.tool_choice, str):
        fields["tool_choice"] = req.tool_choice
    elif req.tool_choice is not None:
        fields["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    given = req.model_fields_set  # the sampling defaults apply to what the request leaves out
    for ours, chat in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                       ("top_p", "top_p")):
        if ours in given and getattr(req, ours) is not None:
            fields[chat] = getattr(req, ours)
    return ChatCompletionRequest.model_validate(fields)


class _Shape:
    """One response's ids and its fixed fields, shared by the final object and the stream."""

    def __init__(self, state: ServerState, req: ResponsesRequest, lora: str | None = None) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.msg_id, self.rs_id = f"msg_{uuid.uuid4().hex}", f"rs_{uuid.uuid4().hex}"
        self.call_ids: dict[str, str] = {}  # a call's call_id -> its item's id
        self.created = int(time.time())
        choice = req.tool_choice or "auto"
        self.head = {"id": self.id, "object": "response", "created_at": self.created,
                     "model": lora or state.model_name, "instructions": req.instructions,
                     "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
                     "temperature": req.temperature, "top_p": req.top_p,
                     "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
                     "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
                     "parallel_tool_calls": req.parallel_tool_calls, "store": False,
                     "text": _text_config(req), "error": None}

    def reasoning(self, text: str, status: str = "completed") -> dict:
        return {"type": "reasoning", "id": self.rs_id, "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}]}

    def message(self, text: str | None, status: str = "completed") -> dict:
        content = [] if text is None else [_text_part(text)]
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": content}

    def call(self, call: dict, status: str = "completed") -> dict:
        """A `function_call` item of a chat tool call (its id is the item's `call_id`)."""
        fn = call["function"]
        item_id = self.call_ids.setdefault(call["id"], f"fc_{uuid.uuid4().hex}")
        return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": fn["name"],
                "arguments": fn["arguments"], "status": status}

    def response(self, status: str, output: list[dict], c: Choice | None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        body = self.head | {"status": status, "output": output, "incomplete_details": incomplete,
                            "usage": None}
        if c is not None:
            body["usage"] = {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens,
                             "total_tokens": c.prompt_tokens + c.completion_tokens,
                             "input_tokens_details": {"cached_tokens": c.cached_tokens},
                             # not counted here; present because clients read it
                             "output_tokens_details": {"reasoning_tokens": 0}}
        return body


def _text_config(req: ResponsesRequest) -> dict:
    """The `text` member of the response: the format the request asked for."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None:
        return {"format": {"type": "text"}}
    return {"format": fmt.model_dump(by_alias=True, exclude_none=True)}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _output(shape: _Shape, out: ChatOutput, status: str, forced: bool = False) -> list[dict]:
    """The reasoning (if any), the message (unless only calls came), then each call; in the order
    the stream sends them, so a forced call's text (what max_tokens cut) comes after its calls."""
    msg = out.message()
    items = [shape.reasoning(msg["reasoning_content"])] if msg.get("reasoning_content") else []
    calls = [shape.call(c) for c in msg.get("tool_calls") or []]
    message = [shape.message(msg["content"] or "", status)] if msg["content"] or not calls else []
    return items + (calls + message if forced else message + calls)


def _constraint(req: ResponsesRequest) -> Constraint | None:
    """`text.format` as the chat route's `response_format`: the grammar of the output."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object" or fmt.schema_ is None:
        return schema_constraint(ANY_JSON_OBJECT, "text.format")
    return schema_constraint(fmt.schema_, "text.format.schema")


@router.post("/v1/responses")
async def responses(req: ResponsesRequest, raw: Request, state: StateDep):
    check_model(state, req.model)
    refuse_unsupported(req, "responses")
    chat = _chat_request(req)
    lora = requested_adapter(state, req.model, chat.lora_path)
    try:
        plan = await run_in_threadpool(plan_tools, chat, state.tool_parser)  # (schema checks: CPU)
    except APIError as e:  # the field as this route names it: no `function` level
        raise APIError(e.status, e.message, e.param and e.param.replace(".function", ""), e.code) from None
    plan, grammar = output_grammar(state, plan, await run_in_threadpool(_constraint, req), "text.format")
    limit = chat.max_tokens
    # the conversation is the request's `input`, however the engine or the prompt's bound names it
    names = {"max_tokens": "max_output_tokens", "prompt": "input", "messages": "input"}
    names |= grammar.names if grammar is not None else {}
    params = build_params(chat, state.cfg.default_max_tokens if limit is None else limit, None, names,
                          grammar, state.request_defaults)
    prompts = [Prompt(chat=chat_messages(chat.messages), tools=plan.tools_json,
                      **template_options(chat.messages, True, False, None))]
    d = Dispatch(state.frontend, prompts, params, 1, limit is None, names, lora)
    shape = _Shape(state, req, lora)
    if not req.stream:
        c = (await d.collect(raw))[0]
        out = plan.new_output()
        out.feed(c.text, final=True)
        status = _status(c.finish_reason)
        return shape.response(status, _output(shape, out, status, plan.forced), c)
    first = await d.start(raw)
    if first is None:
        return Response(status_code=204)  # the client is gone: nobody reads this
    return StreamingResponse(_stream(d, first, raw, shape, plan.new_output()),
                             media_type="text/event-stream")


def _event(seq: Iterator[int], kind: str, **fields: Any) -> str:
    body = {"type": kind, "sequence_number": next(seq)} | fields
    return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _stream(d: Dispatch, first: Any, raw: Request, shape: _Shape, out: ChatOutput) -> AsyncIterator[str]:
    """The Responses events: the reasoning item (if any) streams first, then the message item,
    then each function call; each item opens, streams its text (a call: its arguments), and
    closes before the next opens."""
    seq = itertools.count()
    c = Choice(0)
    yield _event(seq, "response.created", response=shape.response("in_progress", [], None))
    yield _event(seq, "response.in_progress", response=shape.response("in_progress", [], None))
    items: list[dict] = []  # the closed items
    open_kind: str | None = None  # "reasoning" | "message" | "call"
    call: dict | None = None  # the open call, as the chat output holds it
    text = ""

    def close(status: str) -> list[str]:
        idx = len(items)
        if open_kind == "reasoning":
            item = shape.reasoning(text)
            items.append(item)
            return [_event(seq, "response.reasoning_text.done", item_id=shape.rs_id, output_index=idx,
                           content_index=0, text=text),
                    _event(seq, "response.output_item.done", output_index=idx, item=item)]
        if open_kind == "call":
            assert call is not None
            item = shape.call(call)
            items.append(item)
            return [_event(seq, "response.function_call_arguments.done", item_id=item["id"],
                           output_index=idx, name=item["name"], arguments=item["arguments"]),
                    _event(seq, "response.output_item.done", output_index=idx, item=item)]
        item = shape.message(text, status)
        items.append(item)
        return [_event(seq, "response.output_text.done", item_id=shape.msg_id, output_index=idx,
                       content_index=0, text=text, logprobs=[]),
                _event(seq, "response.content_part.done", item_id=shape.msg_id, output_index=idx,
                       content_index=0, part=_text_part(text)),
                _event(seq, "response.output_item.done", output_index=idx, item=item)]

    def switch(kind: str, new_call: dict | None = None) -> list[str]:
        """Close the open item (if any), open a `kind` one."""
        nonlocal open_kind, text, call
        events = close("completed") if open_kind is not None else []
        open_kind, text, call, idx = kind, "", new_call, len(items)
        if kind == "reasoning":
            return events + [_event(seq, "response.output_item.added", output_index=idx,
                                    item=shape.reasoning("", "in_progress") | {"content": []})]
        if kind == "call":
            assert new_call is not None
            return events + [_event(seq, "response.output_item.added", output_index=idx,
                                    item=shape.call(new_call, "in_progress") | {"arguments": ""})]
        return events + [_event(seq, "response.output_item.added", output_index=idx,
                                item=shape.message(None, "in_progress")),
                         _event(seq, "response.content_part.added", item_id=shape.msg_id,
                                output_index=idx, content_index=0, part=_text_part(""))]

    try:
        async for _, r in d.events(first, raw):
            c.add(r)
            for delta in out.feed(r.text, final=r.finished):
                if "tool_calls" in delta:
                    tc = delta["tool_calls"][0]
                    if "id" in tc:  # a call starts
                        for e in switch("call", out.calls[tc["index"]]):
                            yield e
                    piece = tc["function"].get("arguments", "")
                    if piece:
                        assert call is not None  # a call's arguments follow its start
                        yield _event(seq, "response.function_call_arguments.delta",
                                     item_id=shape.call_ids[call["id"]], output_index=len(items),
                                     delta=piece)
                    continue
                kind, piece = (("reasoning", delta["reasoning_content"]) if "reasoning_content" in delta
                               else ("message", delta.get("content", "")))
                if kind != open_kind:
                    for e in switch(kind):
                        yield e
                text += piece
                name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
                item_id = shape.rs_id if kind == "reasoning" else shape.msg_id
                extra = {} if kind == "reasoning" else {"logprobs": []}
                yield _event(seq, name, item_id=item_id, output_index=len(items), content_index=0,
                             delta=piece, **extra)
        status = _status(c.finish_reason)
        if open_kind in (None, "reasoning"):  # (calls, when any, come last)
            for e in switch("message"):  # no answer and no call: still one (empty) message item
                yield e
        for e in close(status):
            yield e
        done = "response.completed" if status == "completed" else "response.incomplete"
        yield _event(seq, done, response=shape.response(status, items, c))
    except APIError as e:  # after the headers: an error event ends the stream
        yield _event(seq, "error", **error_body(e.status, e.message, e.param, e.code)["error"])

