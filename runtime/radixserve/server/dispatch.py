"""Fan one HTTP request out to its sub-requests (prompts × n) and gather their replies, either all
at once or as a stream of events; server-sent events framing."""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request

from radixserve.messages import TokenizeMsg, TokenLogprob, UserReply
from radixserve.sampling_params import SamplingParams
from radixserve.server.frontend import Frontend, RequestStream

_DISCONNECT_CHECK_S = 0.5


@dataclass
class Prompt:
    text: str | None = None
    chat: list[dict] | None = None
    input_ids: list[int] | None = None


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, r: UserReply) -> None:
        self.text += r.text
        self.token_ids += r.token_ids
        self.logprobs += r.logprobs or []
        if r.finished:
            self.finish_reason = r.finish_reason
            self.prompt_tokens, self.completion_tokens = r.prompt_tokens, r.completion_tokens


def usage(choices: list[Choice], n: int) -> dict:
    """Each distinct prompt counts once, however many choices share it (as OpenAI counts)."""
    prompt = sum(c.prompt_tokens for c in choices if c.index % n == 0)
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Dispatch:
    def __init__(self, frontend: Frontend, prompts: list[Prompt], params: SamplingParams, n: int, auto_max_tokens: bool) -> None:
        self.frontend, self.n = frontend, n
        self.msgs: list[TokenizeMsg] = []
        for prompt in prompts:
            for j in range(n):
                p = dataclasses.replace(params, seed=None if params.seed is None else params.seed + j)
                self.msgs.append(TokenizeMsg(frontend.new_uid(), p, prompt.text, prompt.chat, prompt.input_ids, auto_max_tokens))
        self.index = {m.uid: i for i, m in enumerate(self.msgs)}
        self.stream: RequestStream | None = None

    async def start(self) -> UserReply:
        """Submit, and wait for the first reply so that a rejected request still gets its 4xx."""
        self.stream = await self.frontend.submit(self.msgs)
        try:
            return await self.stream.next()
        except BaseException:
            self.stream.close()
            raise

    async def events(self, first: UserReply, raw: Request | None) -> AsyncIterator[tuple[int, UserReply]]:
        """(choice index, reply) until every sub-request finished; aborts the rest if left early."""
        assert self.stream is not None
        try:
            reply, checked = first, time.monotonic()
            while True:
                yield self.index[reply.uid], reply
                if self.stream.done:
                    return
                if raw is not None and time.monotonic() - checked > _DISCONNECT_CHECK_S:
                    checked = time.monotonic()
                    if await raw.is_disconnected():
                        return
                reply = await self.stream.next()
        finally:
            self.stream.close()

    async def collect(self, raw: Request) -> list[Choice]:
        choices = [Choice(i) for i in range(len(self.msgs))]
        async for i, reply in self.events(await self.start(), raw):
            choices[i].add(reply)
        return choices


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"
