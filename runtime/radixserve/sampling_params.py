"""Per-request sampling parameters, validated at the edge so bad values never reach the scheduler."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

from radixserve.json_checks import loads_bounded

MAX_TOKEN_ID = 2**31 - 1  # also the largest max_tokens / top_k: every count fits in int32
MAX_LOGIT_BIAS = 1024  # entries of logit_bias
MAX_LOGPROBS = 20
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")  # at most one constrains a request's output


class Bounds(NamedTuple):
    low: float
    high: float
    open_low: bool = False  # (low, high] rather than [low, high]

    def holds(self, x: float) -> bool:
        return (self.low < x if self.open_low else self.low <= x) and x <= self.high

    def words(self) -> str:
        return f"must be in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}]"

    def pydantic(self) -> dict[str, float]:
        """The bounds as pydantic's `Field` keywords (the HTTP API's models and OpenAPI schema)."""
        return {"gt" if self.open_low else "ge": self.low, "le": self.high}


# Each bounded number of a request, declared once: `SamplingParams` checks it, and the HTTP API's
# request models (server/protocol.py) take it from here for their schema
BOUNDS: dict[str, Bounds] = {
    "max_tokens": Bounds(1, MAX_TOKEN_ID),
    "temperature": Bounds(0.0, 100.0),
    "top_k": Bounds(-1, MAX_TOKEN_ID),  # (-1: disabled; 0 is refused too)
    "top_p": Bounds(0.0, 1.0, open_low=True),
    "min_p": Bounds(0.0, 1.0),
    "presence_penalty": Bounds(-2.0, 2.0),
    "frequency_penalty": Bounds(-2.0, 2.0),
    "repetition_penalty": Bounds(0.0, 2.0, open_low=True),
    "logprobs": Bounds(0, MAX_LOGPROBS),
    "prompt_logprobs": Bounds(0, MAX_LOGPROBS),
    "priority": Bounds(-MAX_TOKEN_ID - 1, MAX_TOKEN_ID),
    "min_tokens": Bounds(0, MAX_TOKEN_ID),
    "truncate_prompt_tokens": Bounds(1, MAX_TOKEN_ID),
}


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 means greedy
    top_k: int = -1  # -1 means all tokens
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's logprob plus top-k
    # OpenAI's logit_bias: token id -> added to its logit (float32) before sampling; -100 bans it
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0  # EOS, stop_token_ids and stop strings take effect only after this many
    # the logprob of every prompt token after the first, with the k best at its position
    # (vLLM's prompt_logprobs; completions' echo): the whole prompt is computed, not cached
    prompt_logprobs: int | None = None
    priority: int = 0  # admission order: lower first, arrival order among equals (vLLM's)
    skip_special_tokens: bool = True  # special tokens (EOS, chat markers) left out of the text
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last N tokens (vLLM's)
    # an embedding request: the prompt's last hidden state (L2-normalized), no token generated
    embed: bool = False
    # grammar-constrained decoding (xgrammar): the output must match; the request ends ("stop")
    # when the grammar is complete, even with ignore_eos
    json_schema: str | None = None  # a JSON Schema as JSON text; '{"type": "object"}': any object
    regex: str | None = None
    ebnf: str | None = None  # GBNF/EBNF as xgrammar reads it, root rule `root`

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.logit_bias, dict):  # JSON's keys are strings: OpenAI sends "1234"
            self.logit_bias = {int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else k: v
                               for k, v in self.logit_bias.items()}
        self.validate()

    def validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            got = repr(getattr(self, name))
            return ValueError(f"{name} {why}, got {got if len(got) <= 40 else got[:40] + '…'}")

        def integer(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        if not integer(self.max_tokens):
            raise bad("max_tokens", "must be an integer")
        for name in ("top_k", "logprobs", "prompt_logprobs", "priority", "min_tokens",
                     "truncate_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and not integer(value):
                raise bad(name, "must be an integer")
        for name, bounds in BOUNDS.items():
            value = getattr(self, name)
            if value is not None and not bounds.holds(value):
                raise bad(name, bounds.words())
        if self.top_k == 0:
            raise bad("top_k", "must be -1 (disabled) or a positive integer")
        if self.seed is not None and (not integer(self.seed) or not 0 <= self.seed < 2**63):
            raise bad("seed", "must be an integer in [0, 2**63)")
        if self.embed and (self.max_tokens != 1 or self.constrained or self.prompt_logprobs is not None):
            raise bad("embed", "takes no generation options (max_tokens 1, no grammar or prompt_logprobs)")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if not isinstance(self.stop_token_ids, list) or not all(
            integer(t) and 0 <= t <= MAX_TOKEN_ID for t in self.stop_token_ids
        ):
            raise bad("stop_token_ids", f"must be a list of integers in [0, {MAX_TOKEN_ID}]")
        if not isinstance(self.logit_bias, dict) or len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise bad("logit_bias", f"must map at most {MAX_LOGIT_BIAS} token ids to biases")
        for tok, bias in self.logit_bias.items():
            if not integer(tok) or not 0 <= tok <= MAX_TOKEN_ID:
                raise ValueError(f"logit_bias keys must be token ids in [0, {MAX_TOKEN_ID}], "
                                 f"got {str(tok)[:40]!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
                raise bad("logit_bias", "values must be numbers in [-100, 100]")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", f"must be an integer in [0, max_tokens = {self.max_tokens}]")
        given = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        for name in given:
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise bad(name, "must be a non-empty string")
        if len(given) > 1:
            raise bad(given[1], f"cannot be combined with {given[0]}: give at most one of "
                                f"{', '.join(GRAMMAR_FIELDS)}")
        if given and self.min_tokens:
            # the grammar may end the reply (only EOS allowed) before min_tokens would let it
            raise bad("min_tokens", f"cannot be combined with {given[0]}: the grammar decides "
                                    "where the output ends")
        if self.json_schema is not None:
            try:
                loads_bounded(self.json_schema)
            except ValueError as e:  # invalid JSON, or nested too deeply for the grammar compiler
                raise bad("json_schema", f"must be valid JSON of a bounded depth ({e})") from None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(field name, text) of the grammar that constrains the output, or None."""
        return next(((n, getattr(self, n)) for n in GRAMMAR_FIELDS if getattr(self, n) is not None),
                    None)

    @property
    def constrained(self) -> bool:
        return self.grammar is not None

    @property
    def adjusts_logits(self) -> bool:
        """Anything that changes the logits before the pick (the sampler's slow path)."""
        return bool(self.logit_bias) or self.min_tokens > 0 or self.has_penalties

    @property
    def has_penalties(self) -> bool:
        """Penalties read the tokens generated so far (so overlap must not run ahead of them)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """The parameters of a request's `n` choices, each its own request: choice j samples with
    seed + j (with a seed), so the choices differ yet are reproducible. The server's `n` and
    `LLM`'s both fan out here, so they give the same choices."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return [dataclasses.replace(params, seed=None if params.seed is None else params.seed + j)
            for j in range(n)]
