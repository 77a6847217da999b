"""What a scheduler step reports for each request: a sampled token, or a failure after admission."""
from __future__ import annotations

from typing import NamedTuple


class TokenOutput(NamedTuple):
    """One sampled token of one request, as the scheduler reports it after a step."""

    uid: int
    token_id: int
    finished: bool
    finish_reason: str | None  # "stop" (EOS / stop token), "length" (max_tokens), "abort"
    logprob: float | None = None  # log-probability of token_id, when the request asked for logprobs
    top_logprobs: list[tuple[int, float]] | None = None  # (token id, logprob), best first
    prompt_tokens: int = 0  # the request's prompt length (for usage)
    # with the first token of a request that asked for them: (token id, logprob, top) of each
    # prompt token, the first with logprob None
    prompt_logprobs: list[tuple[int, float | None, list[tuple[int, float]]]] | None = None
    embedding: list[float] | None = None  # an embedding request's answer (token_id is -1)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (for usage)
    # speculative decoding so far: tokens drafted for the request, drafts kept, verify steps
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_steps: int = 0


class RequestFailure(NamedTuple):
    """A request the scheduler dropped after accepting it (its grammar did not compile, or a token
    broke it): the server answers it with this HTTP status, `LLM.generate` raises."""

    uid: int
    message: str  # starts with `param`, as SamplingParams' own errors do
    param: str | None  # the SamplingParams field at fault
    status: int = 400
