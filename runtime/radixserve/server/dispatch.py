"""Fan one HTTP request out to its sub-requests (prompts × n) and gather their replies, either all
at once or as a stream of events; server-sent events framing."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request

from radixserve.messages import TokenizeMsg, TokenLogprob, UserReply
from radixserve.sampling_params import SamplingParams, choice_params
from radixserve.server.access_log import current_access
from radixserve.server.errors import APIError, error_body
from radixserve.server.frontend import Frontend, RequestStream

logger = logging.getLogger("radixserve.server")

_DISCONNECT_CHECK_S = 0.5
# Replies that never pause (a fast model) would never reach the check above: also look this often.
_BUSY_DISCONNECT_CHECK_S = 0.1


@dataclass
class Prompt:
    text: str | None = None
    chat: list[dict] | None = None
    input_ids: list[int] | None = None
    tools: str | None = None  # chat: the tools for the template, as JSON text
    add_generation_prompt: bool = True  # chat: the template's options (`TokenizeMsg`)
    continue_final_message: bool = False
    template_kwargs: str | None = None


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | int | None = None  # the stop string or token that ended a "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those served from the prefix cache
    spec_drafted: int = 0  # speculative decoding: tokens drafted, drafts kept, verify steps
    spec_accepted: int = 0
    spec_steps: int = 0
    prompt_text: str | None = None  # with prompt logprobs (completions' echo)
    prompt_logprobs: list[TokenLogprob] | None = None
    embedding: list[float] | None = None  # an embedding request's answer

    def add(self, r: UserReply) -> None:
        if r.prompt_logprobs is not None:
            self.prompt_text, self.prompt_logprobs = r.prompt_text, r.prompt_logprobs
        if r.embedding is not None:
            self.embedding = r.embedding
        self.text += r.text
        self.token_ids += r.token_ids
        self.logprobs += r.logprobs or []
        # every reply carries the counts so far (a stream's continuous_usage_stats), the last the
        # totals; an abort's reply carries none
        self.prompt_tokens = max(self.prompt_tokens, r.prompt_tokens)
        self.completion_tokens = max(self.completion_tokens, r.completion_tokens)
        self.cached_tokens = max(self.cached_tokens, r.cached_tokens)
        self.spec_drafted = max(self.spec_drafted, r.spec_drafted)
        self.spec_accepted = max(self.spec_accepted, r.spec_accepted)
        self.spec_steps = max(self.spec_steps, r.spec_steps)
        if r.finished:
            self.finish_reason, self.matched_stop = r.finish_reason, r.matched_stop


def usage(choices: list[Choice], n: int) -> dict:
    """Each distinct prompt counts once, however many choices share it (as OpenAI counts);
    `cached_tokens` is how many of its tokens the prefix cache served, not computed again."""
    firsts = [c for c in choices if c.index % n == 0]
    prompt = sum(c.prompt_tokens for c in firsts)
    completion = sum(c.completion_tokens for c in choices)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in firsts)}}
    if steps := sum(c.spec_steps for c in choices):
        out["speculative"] = speculative_usage(sum(c.spec_drafted for c in choices),
                                               sum(c.spec_accepted for c in choices), steps)
    return out


def speculative_usage(drafted: int, accepted: int, steps: int) -> dict:
    """Usage's extension for speculative decoding: tokens drafted and kept, and per verification
    step the tokens produced (`accept_length`: the kept drafts and the target's own token)."""
    return {"draft_tokens": drafted, "accepted_tokens": accepted, "verify_steps": steps,
            "accept_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "accept_length": round((accepted + steps) / steps, 4)}


class Dispatch:
    def __init__(self, frontend: Frontend, prompts: list[Prompt], params: SamplingParams, n: int, auto_max_tokens: bool,
                 names: dict[str, str] | None = None, lora: str | None = None) -> None:
        """`names`: the request's name of an engine field (`json_schema` → `response_format`), for
        the `param` of a failure the pipeline reports. `lora`: the LoRA adapter to run with."""
        self.frontend, self.n, self.names = frontend, n, names or {}
        self.msgs: list[TokenizeMsg] = []
        for prompt in prompts:
            for p in choice_params(params, n):  # as `LLM`'s n: the same choices
                self.msgs.append(TokenizeMsg(frontend.new_uid(), p, prompt.text, prompt.chat, prompt.input_ids,
                                             auto_max_tokens, prompt.tools, prompt.add_generation_prompt,
                                             prompt.continue_final_message, prompt.template_kwargs, lora))
        self.index = {m.uid: i for i, m in enumerate(self.msgs)}
        self.stream: RequestStream | None = None
        self.access = current_access.get()  # the HTTP request's record, for its access line
        self._checked = time.monotonic()  # when the client's connection was last looked at

    async def start(self, raw: Request | None = None) -> UserReply | None:
        """Submit, and wait for the first reply so that a rejected request still gets its 4xx.
        None when the client left first (while queued or prefilling): the request is aborted."""
        try:
            self.stream = await self.frontend.submit(self.msgs)
        except APIError as e:  # refused before it was queued (a prompt too long by its characters)
            raise self._renamed(e) from None
        try:
            first = await self._next(raw)
        except BaseException:
            self.stream.close()
            raise
        if first is None:
            self.stream.close()
        return first

    async def _next(self, raw: Request | None) -> UserReply | None:
        """The next reply, or None as soon as the client is gone (checked while waiting)."""
        try:
            return await self._wait(raw)
        except APIError as e:
            raise self._renamed(e) from None

    def _renamed(self, e: APIError) -> APIError:
        """`e` naming the field as the client did (`names`)."""
        name = self.names.get(e.param or "")
        if name is not None:
            assert e.param is not None
            if e.message.startswith(e.param):  # "json_schema: could not compile …"
                e.message = name + e.message[len(e.param):]
            e.param = name
        return e

    async def _wait(self, raw: Request | None) -> UserReply | None:
        assert self.stream is not None
        if raw is None:
            return await self.stream.next()
        if time.monotonic() - self._checked >= _BUSY_DISCONNECT_CHECK_S:
            self._checked = time.monotonic()
            if await raw.is_disconnected():
                return None
        task = asyncio.ensure_future(self.stream.next())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_CHECK_S)
                if done:
                    return task.result()
                if await raw.is_disconnected():
                    return None
        finally:
            if not task.done():
                task.cancel()

    async def events(self, first: UserReply | None, raw: Request | None) -> AsyncIterator[tuple[int, UserReply]]:
        """(choice index, reply) until every sub-request finished; aborts the rest if left early."""
        assert self.stream is not None
        try:
            reply = first
            while reply is not None:
                i = self.index[reply.uid]
                if self.access is not None:
                    self.access.on_reply(reply, i % self.n == 0)
                yield i, reply
                if self.stream.done:
                    return
                reply = await self._next(raw)
        finally:
            self.stream.close()

    async def collect(self, raw: Request) -> list[Choice]:
        choices = [Choice(i) for i in range(len(self.msgs))]
        async for i, reply in self.events(await self.start(raw), raw):
            choices[i].add(reply)
        return choices


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def ending_properly(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """An SSE stream that always ends with `[DONE]`: a failure after the headers were sent (a dead
    scheduler, the drain deadline, a bug) becomes an error event first."""
    try:
        async for event in events:
            yield event
    except APIError as e:
        logger.warning("stream ended by an error (%d): %s", e.status, e.message)
        yield sse(error_body(e.status, e.message, e.param, e.code))
        yield sse("[DONE]")
    except Exception:
        logger.exception("stream failed")
        yield sse(error_body(500, "internal server error"))
        yield sse("[DONE]")
