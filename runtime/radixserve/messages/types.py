"""The messages between the server's processes. Flow: API → TokenizeMsg → tokenizer → UserMsg →
scheduler → TokenBatch → detokenizer → UserReply → API; AbortMsg goes to the scheduler from the API
(client gone) and the detokenizer (stop string); SchedulerStats and Heartbeat go to the API periodically.
LoadLoRA and UnloadLoRA go from the API to the scheduler, which answers with a LoRAReply.
Under tensor parallelism rank 0 publishes the UserMsg, AbortMsg, LoadLoRA and UnloadLoRA it
applied, with GrammarsReady, to the other ranks before each step, and LeaveGroup at the end
(`ranks/channel.py`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.messages.codec import message, register_external
from radixserve.sampling_params import SamplingParams

register_external(SamplingParams)


@message
@dataclass
class TextOpMsg:
    """API → tokenizer: `/tokenize` or `/detokenize` alone, nothing generated."""

    uid: int
    op: str  # "tokenize" | "detokenize"
    text: str | None = None
    chat: list[dict] | None = None  # as TokenizeMsg's
    tokens: list[int] | None = None  # detokenize
    add_special_tokens: bool = True  # tokenize a text
    add_generation_prompt: bool = True  # tokenize a chat
    continue_final_message: bool = False
    template_kwargs: str | None = None  # JSON text


@message
@dataclass
class TextOpReply:
    """Tokenizer → API: the answer to a TextOpMsg, or the field at fault and why."""

    uid: int
    tokens: list[int] | None = None
    text: str | None = None
    error: str | None = None
    param: str | None = None


@message
@dataclass
class TokenizeMsg:
    uid: int
    params: SamplingParams
    text: str | None = None  # a plain prompt
    # chat messages, content flattened to a string, tool calls' arguments as JSON text
    chat: list[dict] | None = None
    input_ids: list[int] | None = None  # already tokenized
    auto_max_tokens: bool = False  # the client gave no limit: the scheduler fills in the context left
    # the chat's tools (OpenAI's `tools`) as JSON text. NOTE: JSON text, not maps: a client's map
    # holding the codec's type tag must not be revived as a message on the way
    tools: str | None = None
    # chat: end with the assistant's turn opened, or continue the last (assistant) message
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: str | None = None  # chat_template_kwargs as JSON text (as `tools`)
    lora: str | None = None  # the LoRA adapter to run with (None: the base model)


@message
@dataclass
class UserMsg:
    uid: int
    input_ids: list[int]
    params: SamplingParams
    auto_max_tokens: bool = False
    lora: str | None = None  # the LoRA adapter to run with (None: the base model)


@message
@dataclass
class AbortMsg:
    uid: int


@message
@dataclass
class TokenMsg:
    uid: int
    token_id: int
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    logprob: float | None = None
    top_logprobs: list[list] | None = None  # [[token id, logprob], …] best first
    # on a request's first token, if asked for: [[token id, logprob or None, [[id, logprob], …]], …]
    prompt_logprobs: list[list] | None = None
    embedding: list[float] | None = None  # an embedding request's answer (token_id is -1)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    # speculative decoding so far: tokens drafted for the request, drafts kept, verify steps
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_steps: int = 0


@message
@dataclass
class TokenBatch:
    outputs: list[TokenMsg]


@message
@dataclass
class RequestFailed:
    """A request rejected after it left the API (tokenizer or scheduler): becomes an HTTP 4xx."""

    uid: int
    message: str
    param: str | None = None
    code: str | None = None
    status: int = 400


@message
@dataclass
class TokenLogprob:
    token: str
    logprob: float | None  # None: the prompt's first token (nothing before it)
    top: list[list] = field(default_factory=list)  # [[token text, logprob], …]


@message
@dataclass
class UserReply:
    uid: int
    text: str  # the new text since the previous reply
    token_ids: list[int]  # the new tokens since the previous reply
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # with the first reply, if asked for
    prompt_text: str | None = None  # the prompt decoded, with `prompt_logprobs`
    embedding: list[float] | None = None  # an embedding request's answer
    cached_tokens: int = 0  # of prompt_tokens, those served from the prefix cache
    spec_drafted: int = 0  # speculative decoding so far (as TokenMsg's)
    spec_accepted: int = 0
    spec_steps: int = 0
    # what ended a "stop" reply: the stop string, or the token (EOS, a stop token id)
    matched_stop: str | int | None = None


@message
@dataclass
class SchedulerStats:
    """Heartbeat and gauges; `integrity_ok` is None while the scheduler is busy (not checked).
    `lora`: each LoRA adapter with requests, [running, waiting]."""

    stats: dict[str, int]
    integrity_ok: bool | None
    lora: dict[str, list[int]] = field(default_factory=dict)


@message
@dataclass
class Heartbeat:
    """Scheduler → API several times a second from a thread of its own, so a long step does not silence it:
    `step_age` is how long the scheduler loop's current iteration has been running."""

    step_age: float


@message
@dataclass
class RequestStarted:
    """Scheduler → detokenizer, on the token socket, before the request's first token."""

    uid: int
    stop: list[str]
    logprobs: bool
    min_tokens: int = 0  # stop strings count from this many tokens on
    skip_special_tokens: bool = True


@message
@dataclass
class GrammarsReady:
    """Rank 0 → the other ranks, among the messages of a step: the grammar-constrained requests
    rank 0 queued (`compiled`) or failed this step, so that every rank queues the same requests at
    the same step, whatever its own compilations' timing."""

    compiled: list[int]
    failed: list[int]


@message
@dataclass
class LoadLoRA:
    """API → scheduler (and rank 0 → the other ranks, once it loaded it): serve the PEFT adapter
    at `path` as `name`."""

    uid: int
    name: str
    path: str


@message
@dataclass
class UnloadLoRA:
    """API → scheduler (and rank 0 → the other ranks): stop serving adapter `name`."""

    uid: int
    name: str


@message
@dataclass
class LoRAReply:
    """Scheduler → API: the outcome of a LoadLoRA or UnloadLoRA (`error` and its HTTP status, or
    None) and the adapters served after it, name → path."""

    uid: int
    adapters: dict[str, str]
    error: str | None = None
    status: int = 200


@message
@dataclass
class LeaveGroup:
    """Rank 0 → the other ranks: the group ends after this message; leave it together."""
