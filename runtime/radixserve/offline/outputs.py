"""What `LLM` returns: a whole result per choice, or a stream of deltas; and the collector that
gathers one call's replies (or its first failure)."""
from __future__ import annotations

from dataclasses import dataclass

from radixserve.messages import RequestFailed, TokenLogprob, UserReply
from radixserve.offline.pipeline import Reply


@dataclass
class GenerateResult:
    text: str
    token_ids: list[int]  # generated tokens only (up to the one that completed a stop string)
    finish_reason: str  # "stop" (EOS, stop token id, stop string, grammar complete) | "length"
    prompt_token_ids: list[int]
    # with SamplingParams.logprobs: each generated token's text, logprob and best alternatives
    logprobs: list[TokenLogprob] | None = None
    # with SamplingParams.prompt_logprobs: the same for each prompt token (the first's logprob None)
    prompt_logprobs: list[TokenLogprob] | None = None
    embedding: list[float] | None = None  # with SamplingParams(embed=True): no tokens, this


@dataclass
class StreamOutput:
    """What one choice produced since its previous output (as the server's streamed chunks)."""

    index: int  # the choice: prompt index × n + j (0 for one prompt and n=1)
    text: str  # new text; may be "" while a character or a possible stop string is incomplete
    token_ids: list[int]  # new tokens
    finished: bool = False
    finish_reason: str | None = None  # set on the last output


def request_error(failure: RequestFailed | Exception, prompt: int) -> Exception:
    """A refused or failed request as the exception the caller sees: ValueError for the caller's
    mistake (HTTP 4xx), RuntimeError for the engine's, the engine's own exception if it failed."""
    if isinstance(failure, Exception):
        return failure
    kind = ValueError if failure.status < 500 else RuntimeError
    return kind(f"prompt {prompt}: {failure.message}")


def stream_output(r: UserReply, index: int) -> StreamOutput:
    return StreamOutput(index, r.text, list(r.token_ids), r.finished,
                        r.finish_reason if r.finished else None)


class Collector:
    """The replies of one call's requests (`index`: uid -> choice index), joined per choice."""

    def __init__(self, index: dict[int, int], n: int, prompt_ids: list[list[int]],
                 on_finished=None) -> None:
        self.index, self.n, self.prompt_ids, self.on_finished = index, n, prompt_ids, on_finished
        self.text = [""] * len(index)
        self.tokens: list[list[int]] = [[] for _ in index]
        self.reasons: list[str | None] = [None] * len(index)
        self.logprobs: list[list[TokenLogprob] | None] = [None] * len(index)
        self.prompt_logprobs: list[list[TokenLogprob] | None] = [None] * len(index)
        self.embeddings: list[list[float] | None] = [None] * len(index)
        self.left = len(index)
        self.failure: Exception | None = None

    def add(self, r: Reply | Exception) -> None:
        if self.failure is not None:
            return
        if isinstance(r, RequestFailed):
            self.failure = request_error(r, self.index[r.uid] // self.n)
            return
        if isinstance(r, Exception):
            self.failure = r
            return
        i = self.index[r.uid]
        self.text[i] += r.text
        self.tokens[i] += r.token_ids
        if r.logprobs is not None:
            self.logprobs[i] = (self.logprobs[i] or []) + r.logprobs
        if r.prompt_logprobs is not None:
            self.prompt_logprobs[i] = r.prompt_logprobs
        if r.embedding is not None:
            self.embeddings[i] = r.embedding
        if r.finished:
            self.reasons[i] = r.finish_reason or "stop"
            self.left -= 1
            if self.on_finished is not None:
                self.on_finished()

    def done(self) -> bool:
        return self.left == 0 or self.failure is not None

    def results(self) -> list[GenerateResult]:
        if self.failure is not None:
            raise self.failure
        return [GenerateResult(self.text[i], self.tokens[i], self.reasons[i] or "stop",
                               self.prompt_ids[i // self.n], self.logprobs[i],
                               self.prompt_logprobs[i], self.embeddings[i])
                for i in range(len(self.text))]
