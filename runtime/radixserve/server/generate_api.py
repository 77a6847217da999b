"""Native `/generate`: text or token ids in, token ids and text out, in the dialect of SGLang's
(a gateway built for SGLang workers sends its requests here): `sampling_params` takes this
server's names or SGLang's, and each result carries SGLang's `meta_info` (`id`, `finish_reason`
as `{"type", "matched" | "length"}`, `prompt_tokens`, `completion_tokens`, `cached_tokens`,
`e2e_latency`) beside this server's `finish_reason` and `usage`. For a batch of prompts (`text`
a list, `input_ids` a list of lists) or `n` > 1 the answer is a list of results, prompt by prompt,
as SGLang's is; streamed, each event then says its result's `index`."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from radixserve.sampling_params import SamplingParams
from radixserve.server.dispatch import Choice, Dispatch, ending_properly, sse
from radixserve.server.errors import APIError, bad_value
from radixserve.server.extensions import GENERATE, GENERATE_SAMPLING, refuse
from radixserve.server.json_body import ParsedJsonRoute
from radixserve.server.openai_api import check_model, prompt_list, reject_empty, requested_adapter
from radixserve.server.protocol import MAX_N, GenerateRequest, GenerateSampling
from radixserve.server.state import StateDep
from radixserve.server.structured_output import check_json_schema

router = APIRouter(route_class=ParsedJsonRoute)

DEFAULT_MAX_TOKENS = 16
# SGLang's name → this server's
_SGLANG_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}


def sampling_params(sp: GenerateSampling) -> SamplingParams:
    """`sampling_params` as the engine's; a 400 for a field given under both names."""
    refuse(sp.model_dump(include=set(GENERATE_SAMPLING)), GENERATE_SAMPLING, "sampling_params.")
    fields = sp.model_dump(exclude=set(GENERATE_SAMPLING) | set(_SGLANG_NAMES) | {"n", "stream_interval"})
    names = {}  # the engine's field → the client's name for it, for errors
    for theirs, ours in _SGLANG_NAMES.items():
        value = getattr(sp, theirs)
        if value is None:
            continue
        if getattr(sp, ours) not in (None, GenerateSampling.model_fields[ours].default):
            raise APIError(400, f"sampling_params: give {ours} or {theirs} (SGLang's name), not both",
                           f"sampling_params.{theirs}")
        fields[ours], names[ours] = value, theirs
    fields["max_tokens"] = fields["max_tokens"] or DEFAULT_MAX_TOKENS
    fields["stop"] = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
    try:
        return SamplingParams(**fields)
    except ValueError as e:
        raise bad_value(e, names) from None


def _finish(c: Choice, max_tokens: int) -> dict | None:
    if c.finish_reason == "length":
        return {"type": "length", "length": max_tokens}
    if c.finish_reason == "stop":
        return {"type": "stop", "matched": c.matched_stop}
    return None if c.finish_reason is None else {"type": c.finish_reason}


def _result(c: Choice, rid: str, max_tokens: int, t0: float) -> dict:
    meta = {"id": rid, "finish_reason": _finish(c, max_tokens), "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens, "cached_tokens": c.cached_tokens,
            "e2e_latency": round(time.perf_counter() - t0, 6)}
    return {"text": c.text, "output_ids": c.token_ids, "finish_reason": c.finish_reason,
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens},
            "meta_info": meta}


@router.post("/generate")
async def generate(req: GenerateRequest, raw: Request, s: StateDep):
    check_model(s, req.model)
    refuse(req.model_dump(include=set(GENERATE)), GENERATE)
    if (req.text is None) == (req.input_ids is None):
        raise APIError(400, "give exactly one of text and input_ids", "text")
    prompt_field = "text" if req.text is not None else "input_ids"
    prompts = prompt_list(req.text if req.text is not None else req.input_ids, prompt_field)
    reject_empty(prompts, prompt_field)
    batch = isinstance(req.text, list) or (req.input_ids is not None and isinstance(req.input_ids[0], list))
    params = sampling_params(req.sampling_params)
    if params.json_schema is not None:  # (CPU work: off the event loop)
        await run_in_threadpool(check_json_schema, json.loads(params.json_schema), "json_schema")
    n, t0 = req.sampling_params.n, time.perf_counter()
    if len(prompts) * n > MAX_N:  # one HTTP request must not flood the queue
        raise APIError(400, f"prompts × n must be at most {MAX_N}, got {len(prompts) * n}", "sampling_params.n")
    many = batch or n > 1  # SGLang's answer: a list of results, prompt by prompt, n each
    rid = req.rid or uuid.uuid4().hex
    d = Dispatch(s.frontend, prompts, params, n, False, {"prompt": prompt_field},
                 lora=requested_adapter(s, req.model, req.lora_path))

    def result(c: Choice) -> dict[str, Any]:
        return _result(c, f"{rid}-{c.index}" if many else rid, params.max_tokens, t0)

    if not req.stream:
        results = [result(c) for c in await d.collect(raw)]
        return results if many else results[0]

    async def events(first) -> AsyncIterator[str]:
        choices = [Choice(i) for i in range(len(d.msgs))]
        async for i, r in d.events(first, raw):
            choices[i].add(r)
            yield sse({"text": r.text, "output_ids": r.token_ids, "finished": r.finished,
                       "finish_reason": r.finish_reason} | ({"index": i} if many else {}))
        for c in choices:
            yield sse(result(c) | ({"index": c.index} if many else {}))
        yield sse("[DONE]")

    first = await d.start(raw)
    if first is None:
        return Response(status_code=204)  # the client is gone: nobody reads this
    return StreamingResponse(ending_properly(events(first)), media_type="text/event-stream")
