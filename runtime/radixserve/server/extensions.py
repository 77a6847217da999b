"""Fields other servers' clients send beyond what this server declares (vLLM's and SGLang's
extensions, OpenAI's legacy ones). A field this server honours is declared in protocol.py; one it
cannot honour is refused here with a 400 naming it, unless its value is the one that changes
nothing: ignored, it would give the client an answer other than the one it asked for, with a 200.
Any other unknown field is accepted and ignored, as OpenAI's clients send fields a server lacks
(`user`, `store`, `metadata`, `service_tier`, ...)."""
from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel

from radixserve.server.errors import APIError


class Unsupported(NamedTuple):
    neutral: tuple  # the values that ask for nothing (defaults, nulls, empty lists)
    why: str


_BEAM = "beam search is not supported"
_LOGPROBS = "use logprobs (completions: with echo for the prompt's tokens)"
_NEVER_SET = (None,)

# on every generating route (chat, completions)
_COMMON = {
    # vLLM's
    "use_beam_search": Unsupported((False, None), _BEAM),
    "length_penalty": Unsupported((1, 1.0, None), _BEAM),
    "best_of": Unsupported((1, None), "only n independent samples are supported"),
    "include_stop_str_in_output": Unsupported((False, None), "a stop string is never part of the output"),
    "prompt_logprobs": Unsupported(_NEVER_SET, _LOGPROBS),
    "return_tokens_as_token_ids": Unsupported((False, None), "tokens are returned as text"),
    "return_token_ids": Unsupported((False, None), "token ids are returned by /generate"),
    "allowed_token_ids": Unsupported(_NEVER_SET, "use logit_bias"),
    "bad_words": Unsupported((None, []), "use logit_bias"),
    "logits_processors": Unsupported((None, []), "custom logits processors are not supported"),
    "logprob_token_ids": Unsupported(_NEVER_SET, "use logprobs"),
    "spaces_between_special_tokens": Unsupported((True, None), "special tokens are decoded as the tokenizer does"),
    "truncation_side": Unsupported(("left", None), "truncate_prompt_tokens keeps the prompt's last tokens"),
    "cache_salt": Unsupported(_NEVER_SET, "the prefix cache is shared by every request"),
    "kv_transfer_params": Unsupported(_NEVER_SET, "disaggregated serving is not supported"),
    "vllm_xargs": Unsupported((None, {}), "no extension reads them"),
    "thinking_token_budget": Unsupported((None, -1), "the thinking is not budgeted"),
    "repetition_detection": Unsupported(_NEVER_SET, "use repetition_penalty"),
    "mm_processor_kwargs": Unsupported((None, {}), "text only"),
    # SGLang's
    "stop_regex": Unsupported((None, []), "use stop strings"),
    "no_stop_trim": Unsupported((False, None), "a stop string is never part of the output"),
    "return_hidden_states": Unsupported((False, None), "hidden states are not returned"),
    "return_routed_experts": Unsupported((False, None), "expert routing is not returned"),
    "custom_logit_processor": Unsupported(_NEVER_SET, "custom logit processors are not supported"),
    "custom_params": Unsupported((None, {}), "no custom logit processor reads them"),
    "session_params": Unsupported(_NEVER_SET, "sessions are not supported"),
    "bootstrap_host": Unsupported(_NEVER_SET, "disaggregated serving is not supported"),
}

# chat only
_CHAT = _COMMON | {
    "echo": Unsupported((False, None), "chat does not echo the last message"),
    "add_special_tokens": Unsupported((False, None), "the chat template writes the special tokens"),
    "documents": Unsupported((None, []), "the chat template gets messages and tools"),
    "chat_template": Unsupported(_NEVER_SET, "the chat template is the server's (--chat-template)"),
    # OpenAI's legacy function calling
    "functions": Unsupported((None, []), "use tools"),
    "function_call": Unsupported(_NEVER_SET, "use tool_choice"),
    "audio": Unsupported(_NEVER_SET, "text only"),
    "modalities": Unsupported((None, ["text"]), "text only"),
    "web_search_options": Unsupported(_NEVER_SET, "no built-in tools"),
}

# completions only
_COMPLETION = _COMMON | {
    "suffix": Unsupported((None, ""), "text is only appended to the prompt"),
    "add_special_tokens": Unsupported((True, None), "a text prompt gets the tokenizer's special tokens"),
}

# the Responses API's own
_RESPONSES = _COMMON | {
    "truncation": Unsupported(("disabled", None), "a conversation past the context is a 400, never cut"),
    "top_logprobs": Unsupported((None, 0), "logprobs are not returned here (chat's logprobs are)"),
    "max_tool_calls": Unsupported(_NEVER_SET, "use parallel_tool_calls"),
    "prompt": Unsupported(_NEVER_SET, "this server stores no prompts: send instructions and input"),
    **{name: Unsupported(_NEVER_SET, "use text.format") for name in (
        "response_format", "structured_outputs", "json_schema", "regex", "ebnf", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar")},
}

UNSUPPORTED = {"chat": _CHAT, "completion": _COMPLETION, "responses": _RESPONSES}

# SGLang's `/generate`: the request's fields, then its `sampling_params`' (declared in protocol.py)
GENERATE = {
    "return_logprob": Unsupported((False, None), "use /v1/completions with logprobs"),
    "top_logprobs_num": Unsupported((0, None), "use /v1/completions with logprobs"),
    "logprob_start_len": Unsupported((-1, None), "use /v1/completions with echo and logprobs"),
    "return_hidden_states": Unsupported((False, None), "hidden states are not returned"),
    "session_params": _COMMON["session_params"],
    "custom_logit_processor": _COMMON["custom_logit_processor"],
    "image_data": Unsupported(_NEVER_SET, "text only"),
}
GENERATE_SAMPLING = {name: _COMMON[name] for name in ("spaces_between_special_tokens", "no_stop_trim",
                                                       "stop_regex", "custom_params")} | {
    "structural_tag": Unsupported(_NEVER_SET, "use json_schema, regex or ebnf"),
}


def _is_neutral(value: Any, neutral: tuple) -> bool:
    # NOTE: `True == 1` in Python: a boolean is neutral only as a boolean
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral)


def refuse(values: dict[str, Any], table: dict[str, Unsupported], prefix: str = "") -> None:
    """A 400 naming the first of `values` that `table` lists and that asks for something."""
    for name, value in values.items():
        entry = table.get(name)
        if entry is not None and not _is_neutral(value, entry.neutral):
            raise APIError(400, f"{prefix}{name} is not supported by this server: {entry.why}", prefix + name)


def refuse_unsupported(req: BaseModel, route: str) -> None:
    """A 400 naming the first unknown field of `req` that this server cannot honour."""
    refuse(req.model_extra or {}, UNSUPPORTED[route])
