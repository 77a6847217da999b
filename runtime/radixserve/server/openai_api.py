"""`/v1/chat/completions`, `/v1/completions`, `/v1/models`: OpenAI's request and response shapes
over the dispatcher."""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from radixserve.messages import TokenLogprob, UserReply
from radixserve.sampling_params import SamplingParams
from radixserve.server.dispatch import Choice, Dispatch, Prompt, ending_properly, sse, usage
from radixserve.server.errors import APIError, bad_value, short
from radixserve.server.extensions import refuse_unsupported
from radixserve.server.json_body import ParsedJsonRoute
from radixserve.server.protocol import (
    MAX_N,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from radixserve.server.state import ServerState, StateDep
from radixserve.server.structured_output import Constraint, request_constraint
from radixserve.server.tools import ToolPlan, plan_tools

# the API key is checked by `AuthMiddleware`, before the body is read
router = APIRouter(route_class=ParsedJsonRoute)


def unset_defaults(req: BaseModel, defaults: dict[str, Any]) -> dict[str, Any]:
    """The server's sampling defaults (the model's generation config) for the fields `req` left
    out; a field the request gives, even at OpenAI's default value, keeps the request's."""
    return {k: v for k, v in defaults.items() if k not in req.model_fields_set}


def build_params(req: SamplingFields, max_tokens: int, logprobs: int | None,
                 names: dict[str, str] | None = None, grammar: Constraint | None = None,
                 defaults: dict[str, Any] | None = None) -> SamplingParams:
    """`names`: the request's name of an engine field, for the error's `param`; `grammar`: the
    constraint on the output; `defaults`: sampling values for the fields the request leaves out."""
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    fields: dict[str, Any] = dict(
        max_tokens=max_tokens,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
        seed=req.seed, ignore_eos=req.ignore_eos, stop=stop,
        stop_token_ids=list(req.stop_token_ids or []),
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty, logprobs=logprobs,
        logit_bias=dict(req.logit_bias or {}), min_tokens=req.min_tokens, priority=req.priority,
        skip_special_tokens=req.skip_special_tokens, truncate_prompt_tokens=req.truncate_prompt_tokens,
        **({grammar.kind: grammar.value} if grammar is not None else {}),
    )
    try:
        return SamplingParams(**fields | unset_defaults(req, defaults or {}))
    except ValueError as e:
        raise bad_value(e, names) from None


def check_model(state: ServerState, model: str | None) -> str | None:
    """The LoRA adapter a request's `model` names ("NAME" or "BASE:NAME", vLLM's and SGLang's
    forms), None for the base model; a 404 naming what is served for anything else."""
    if model is None or model in (state.model_name, state.model_path):
        return None
    adapter = model.removeprefix(f"{state.model_name}:")
    if adapter in state.adapters:
        return adapter
    served = ", ".join(f"'{n}'" for n in (state.model_name, *sorted(state.adapters)))
    raise APIError(404, f"The model {short(model)} does not exist; this server serves {served}.",
                   "model", "model_not_found")


def requested_adapter(state: ServerState, model: str | None, lora_path: str | None) -> str | None:
    """The LoRA adapter a request runs with: SGLang's `lora_path` field when given (the name of
    a served adapter), else the one its `model` names; each checked as `check_model` checks."""
    by_model = check_model(state, model)
    return by_model if lora_path is None else check_model(state, lora_path)


def reasoning_parser(state: ServerState, grammar: Constraint | None) -> str | None:
    """The server's reasoning parser for a request with output grammar `grammar`: none for a
    constrained deepseek_r1 output, which it would read as thinking until a `</think>` that a
    grammar's output never has."""
    return state.cfg.reasoning_parser if grammar is None or state.cfg.reasoning_parser == "qwen3" else None


def output_grammar(state: ServerState, plan: ToolPlan, grammar: Constraint | None,
                   field: str | None = None) -> tuple[ToolPlan, Constraint | None]:
    """The grammar a chat-like request runs under, a forced tool call's or its own `grammar`
    (never both: a 400 naming `field`, by default the grammar's top-level field), and the tool
    plan with the reasoning parser for it."""
    if plan.forced and grammar is not None:  # the call's arguments are the constrained output
        field = field or grammar.field.split(".")[0]
        raise APIError(400, f"{field} cannot be combined with tool_choice {plan.mode}", field)
    grammar = plan.constraint or grammar
    return dataclasses.replace(plan, reasoning=reasoning_parser(state, grammar)), grammar


# apply_chat_template's own arguments: a template variable must not replace one of them
_TEMPLATE_ARGUMENTS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "tokenize", "padding",
    "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "add_generation_prompt", "continue_final_message",
})


def template_options(messages: list[ChatMessage], add_generation_prompt: bool,
                     continue_final_message: bool, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The chat template's options as `TokenizeMsg`/`TextOpMsg` take them; 400 for a bad mix."""
    if continue_final_message:
        if add_generation_prompt:
            raise APIError(400, "continue_final_message needs add_generation_prompt false: the reply "
                                "continues the last message instead of opening a new turn",
                           "continue_final_message")
        if messages[-1].role != "assistant":
            raise APIError(400, "continue_final_message needs the last message to be the "
                                "assistant's (the text the reply continues)", "continue_final_message")
    if clash := sorted(set(kwargs or {}) & _TEMPLATE_ARGUMENTS):
        raise APIError(400, f"chat_template_kwargs cannot set {', '.join(clash)} (a request field "
                            "or the server's own)", "chat_template_kwargs")
    return {"add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            "template_kwargs": json.dumps(kwargs) if kwargs else None}


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    """The messages as the chat template takes them: `content` a string ("" for none, which every
    template accepts), assistant `tool_calls` and `reasoning_content` and the tool's
    `tool_call_id` kept."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" or p.text is None for p in content):
                raise APIError(400, "only text content parts are supported", f"messages.{i}.content")
            content = "".join(p.text or "" for p in content)
        msg: dict = {"role": m.role, "content": content or ""}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls:
            if m.role != "assistant":
                raise APIError(400, "only assistant messages carry tool_calls", f"messages.{i}.tool_calls")
            msg["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.reasoning_content is not None:  # Qwen3's template shows the last turn's thinking
            if m.role != "assistant":
                raise APIError(400, "only assistant messages carry reasoning_content",
                               f"messages.{i}.reasoning_content")
            msg["reasoning_content"] = m.reasoning_content
        if m.role == "tool":
            if m.tool_call_id is None:
                raise APIError(400, "a tool message needs the tool_call_id it answers", f"messages.{i}.tool_call_id")
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def prompt_list(p: str | list, field: str = "prompt") -> list[Prompt]:
    """A completions `prompt` (or an embeddings `input`) as one Prompt per text or token list."""
    if isinstance(p, str):
        return [Prompt(text=p)]
    if not p:
        raise APIError(400, f"{field} must not be empty", field)
    if all(isinstance(x, int) for x in p):
        return [Prompt(input_ids=list(p))]
    return [Prompt(text=x) if isinstance(x, str) else Prompt(input_ids=list(x)) for x in p]


def reject_empty(prompts: list[Prompt], field: str = "prompt") -> None:
    if any(p.text == "" or p.input_ids == [] for p in prompts):
        raise APIError(400, f"{field} must not be empty", field)


# OpenAI's floor: a token a grammar or a ban excludes has logprob -inf, which JSON cannot carry
MIN_LOGPROB = -9999.0


def _floor(lp: float) -> float:
    return max(lp, MIN_LOGPROB)


def _chat_logprobs(lps: list[TokenLogprob]) -> dict:
    def entry(tok: str, lp: float) -> dict:
        return {"token": tok, "logprob": _floor(lp), "bytes": list(tok.encode("utf-8"))}

    return {"content": [entry(x.token, x.logprob) | {"top_logprobs": [entry(t, v) for t, v in x.top]} for x in lps]}


def _completion_logprobs(lps: list[TokenLogprob], offset: int) -> dict:
    """OpenAI's legacy shape: `top_logprobs` holds the k best and always the chosen token (k + 1
    entries at most; `logprobs: 0`, the chosen token alone)."""
    offsets, pos = [], offset
    for x in lps:
        offsets.append(pos)
        pos += len(x.token)
    return {"tokens": [x.token for x in lps],
            "token_logprobs": [None if x.logprob is None else _floor(x.logprob) for x in lps],
            "top_logprobs": [None if x.logprob is None else {t: _floor(v) for t, v in [*x.top, (x.token, x.logprob)]}
                             for x in lps],
            "text_offset": offsets}


class Echo:
    """Completions' `echo`: the prompt before each choice's text (and, with `logprobs`, its tokens'
    logprobs, the first None, as OpenAI gives them). A text prompt is echoed as sent; a token
    prompt as the engine decodes it."""

    def __init__(self, prompts: list[Prompt], n: int) -> None:
        self.prompts, self.n = prompts, n

    def text(self, c: Choice) -> str:
        sent = self.prompts[c.index // self.n].text
        return sent if sent is not None else (c.prompt_text or "")

    def logprobs(self, c: Choice) -> list[TokenLogprob]:
        return c.prompt_logprobs or []


def check_stream_options(req: SamplingFields) -> None:
    if req.stream_options is not None and not req.stream:  # as OpenAI and vLLM refuse it
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")


async def _run(state: ServerState, raw: Request, req: SamplingFields, prompts: list[Prompt], params: SamplingParams,
               auto_max: bool, kind: str, with_logprobs: bool, names: dict[str, str], tools: ToolPlan | None = None,
               echo: Echo | None = None, lora: str | None = None):
    d = Dispatch(state.frontend, prompts, params, req.n, auto_max, names, lora)
    rid, created = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
    head = {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created, "model": lora or state.model_name}
    plan = tools or ToolPlan("none")
    if not req.stream:
        choices = await d.collect(raw)
        return head | {"choices": [_choice(kind, c, with_logprobs, plan, echo) for c in choices],
                       "usage": usage(choices, req.n)}
    first = await d.start(raw)
    if first is None:
        return Response(status_code=204)  # the client is gone: nobody reads this
    opts = req.stream_options
    # OpenAI's include_usage: a last chunk with the usage; vLLM's continuous_usage_stats with it:
    # every chunk after the opening one carries the usage so far
    usage_mode = "none" if not (opts and opts.include_usage) else "every" if opts.continuous_usage_stats else "last"
    if kind == "chat":
        events = _chat_stream(d, first, raw, head, with_logprobs, usage_mode, req.n, plan)
    else:
        events = _completion_stream(d, first, raw, head, with_logprobs, usage_mode, req.n, echo)
    return StreamingResponse(ending_properly(events), media_type="text/event-stream")


def _choice(kind: str, c: Choice, with_logprobs: bool, plan: ToolPlan, echo: Echo | None = None) -> dict:
    if kind == "chat":
        lp = _chat_logprobs(c.logprobs) if with_logprobs else None
        out = plan.new_output()
        out.feed(c.text, final=True)
        return {"index": c.index, "message": out.message(), "logprobs": lp,
                "finish_reason": out.finish_reason(c.finish_reason), "matched_stop": c.matched_stop}
    head, head_lps = (echo.text(c), echo.logprobs(c)) if echo is not None else ("", [])
    lp = _completion_logprobs(head_lps + c.logprobs, 0) if with_logprobs else None
    return {"index": c.index, "text": head + c.text, "logprobs": lp, "finish_reason": c.finish_reason,
            "matched_stop": c.matched_stop}


def _usage_so_far(usage_mode: str, choices: list[Choice], n: int) -> Callable[[], dict]:
    """The `usage` member of a stream's chunks: absent (`none`), null until the last chunk
    (`last`), or the counts so far (`every`, from the opening chunk on)."""
    return lambda: ({"usage": usage(choices, n)} if usage_mode == "every"
                    else {"usage": None} if usage_mode == "last" else {})


async def _chat_stream(d: Dispatch, first: UserReply, raw: Request, head: dict, with_logprobs: bool,
                       usage_mode: str, n: int, plan: ToolPlan) -> AsyncIterator[str]:
    head = head | {"object": "chat.completion.chunk"}
    choices = [Choice(i) for i in range(len(d.msgs))]
    extra = _usage_so_far(usage_mode, choices, n)
    outputs = [plan.new_output() for _ in choices]
    opening = {"role": "assistant", "content": None if plan.forced else ""}  # a forced call has no content
    for c in choices:  # one prompt: its length is known from the first reply (continuous usage)
        c.prompt_tokens = first.prompt_tokens
    for c in choices:
        yield sse(head | {"choices": [{"index": c.index, "delta": opening, "logprobs": None, "finish_reason": None}]}
                  | extra())
    async for i, r in d.events(first, raw):
        choices[i].add(r)
        # A reply with tokens is sent even when its text is empty (a character still incomplete,
        # text held back by a stop string or as a possible tool call), as sglang does: clients
        # time tokens, not characters.
        deltas = outputs[i].feed(r.text, final=r.finished)
        if not deltas and not r.token_ids and not r.finished:
            continue
        lp = _chat_logprobs(r.logprobs or []) if with_logprobs else None
        for j, delta in enumerate(deltas or [{}]):
            last = j == max(len(deltas), 1) - 1
            reason = outputs[i].finish_reason(r.finish_reason) if r.finished and last else None
            ended = {"matched_stop": r.matched_stop} if reason is not None else {}
            yield sse(head | {"choices": [{"index": i, "delta": delta, "logprobs": lp if j == 0 else None,
                                           "finish_reason": reason} | ended]} | extra())
    if usage_mode != "none":
        yield sse(head | {"choices": [], "usage": usage(choices, n)})
    yield sse("[DONE]")


async def _completion_stream(d: Dispatch, first: UserReply, raw: Request, head: dict, with_logprobs: bool,
                             usage_mode: str, n: int, echo: Echo | None = None) -> AsyncIterator[str]:
    choices = [Choice(i) for i in range(len(d.msgs))]
    extra = _usage_so_far(usage_mode, choices, n)
    echoed = [False] * len(choices)
    async for i, r in d.events(first, raw):
        c = choices[i]
        offset = len(c.text)
        c.add(r)
        if echo is not None:
            if not echoed[i]:  # the choice's first reply brought the prompt's text and logprobs
                echoed[i] = True
                lp = _completion_logprobs(echo.logprobs(c), 0) if with_logprobs else None
                yield sse(head | {"choices": [{"index": i, "text": echo.text(c), "logprobs": lp,
                                               "finish_reason": None}]} | extra())
            offset += len(echo.text(c))
        if not r.text and not r.token_ids and not r.finished:
            continue  # a reply with tokens is sent even when its text is empty (as for chat)
        lp = _completion_logprobs(r.logprobs or [], offset) if with_logprobs else None
        choice = {"index": i, "text": r.text, "logprobs": lp, "finish_reason": r.finish_reason if r.finished else None}
        if r.finished:
            choice["matched_stop"] = r.matched_stop
        yield sse(head | {"choices": [choice]} | extra())
    if usage_mode != "none":
        yield sse(head | {"choices": [], "usage": usage(choices, n)})
    yield sse("[DONE]")


def _chat_grammar(state: ServerState, req: ChatCompletionRequest) -> tuple[ToolPlan, Constraint | None]:
    return output_grammar(state, plan_tools(req, state.tool_parser), request_constraint(req))


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, raw: Request, state: StateDep):
    lora = requested_adapter(state, req.model, req.lora_path)
    refuse_unsupported(req, "chat")
    check_stream_options(req)
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs to be true", "top_logprobs")
    # the schemas' checks are CPU work: off the event loop, which serves /health meanwhile
    plan, grammar = await run_in_threadpool(_chat_grammar, state, req)
    # no limit given: the server's default, capped to the context left once the prompt is known
    names = {"logprobs": "top_logprobs", "prompt": "messages"}
    names |= {"max_tokens": "max_completion_tokens"} if req.max_completion_tokens is not None else {}
    names |= grammar.names if grammar is not None else {}
    params = build_params(req, state.cfg.default_max_tokens if limit is None else limit,
                          (req.top_logprobs or 0) if req.logprobs else None, names, grammar,
                          state.request_defaults)
    options = template_options(req.messages, req.add_generation_prompt, req.continue_final_message,
                               req.chat_template_kwargs)
    prompts = [Prompt(chat=chat_messages(req.messages), tools=plan.tools_json, **options)]
    return await _run(state, raw, req, prompts, params, limit is None, "chat", req.logprobs, names, plan,
                      lora=lora)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, raw: Request, state: StateDep):
    lora = requested_adapter(state, req.model, req.lora_path)
    refuse_unsupported(req, "completion")
    check_stream_options(req)
    grammar = await run_in_threadpool(request_constraint, req)  # (a schema's check: CPU work)
    names = grammar.names if grammar is not None else {}
    params = build_params(req, 16 if req.max_tokens is None else req.max_tokens, req.logprobs, names,
                          grammar, state.request_defaults)
    prompts = prompt_list(req.prompt)
    reject_empty(prompts)
    if len(prompts) * req.n > MAX_N:  # one HTTP request must not flood the queue
        raise APIError(400, f"prompts × n must be at most {MAX_N}, got {len(prompts) * req.n}", "n")
    echo = Echo(prompts, req.n) if req.echo else None
    if echo is not None and (req.logprobs is not None or any(p.text is None for p in prompts)):
        # the prompt's logprobs, or its text from token ids: every prompt token is computed
        params = dataclasses.replace(params, prompt_logprobs=req.logprobs or 0)
    return await _run(state, raw, req, prompts, params, False, "completion", req.logprobs is not None, names,
                      echo=echo, lora=lora)


def model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "radixserve",
            "root": state.model_name, "parent": None, "max_model_len": state.max_seq_len}  # never a path


@router.get("/v1/models")
async def models(state: StateDep) -> dict:
    """The base model, then each LoRA adapter with its `parent` (vLLM's cards); never a path."""
    card = model_card(state)
    adapters = [card | {"id": name, "root": name, "parent": state.model_name} for name in sorted(state.adapters)]
    return {"object": "list", "data": [card, *adapters]}


@router.get("/v1/models/{model:path}")  # (a hub id has a slash: "Qwen/Qwen3-8B")
async def model(model: str, state: StateDep) -> dict:
    """`client.models.retrieve(id)`: the served model's card or an adapter's (`parent`: the
    base), or 404 `model_not_found`."""
    adapter = check_model(state, model)
    card = model_card(state)
    return card if adapter is None else card | {"id": adapter, "root": adapter, "parent": state.model_name}
