"""Prompt → token ids: chat messages through the tokenizer's own chat template (with the request's
tools, as transformers passes them), plain text with the tokenizer's special tokens, token ids as
given."""
from __future__ import annotations

import json

from radixserve.messages import TextOpMsg, TextOpReply, TokenizeMsg
from radixserve.sampling_params import SamplingParams


def template_messages(chat: list[dict]) -> list[dict]:
    """The messages as chat templates read them: a tool call's `arguments` as a map where it is a
    JSON object (Qwen 2.5's and Llama 3.1's templates write `arguments | tojson`; Qwen 3's takes
    either), else the string the client sent."""
    out = []
    for m in chat:
        calls = m.get("tool_calls")
        if calls:
            m = m | {"tool_calls": [c | {"function": c["function"] | {"arguments": _arguments(c["function"]["arguments"])}}
                                    for c in calls]}
        out.append(m)
    return out


def _arguments(text: str) -> dict | str:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def truncated(ids: list[int], params: SamplingParams) -> list[int]:
    """With `truncate_prompt_tokens` only the prompt's last tokens are kept (the end of a long
    document or conversation, where the question is); the server and `LLM` both cut here."""
    keep = params.truncate_prompt_tokens
    return ids[-keep:] if keep is not None else ids


class TokenizeManager:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def tokenize(self, msg: TokenizeMsg) -> list[int]:
        """ValueError (naming the field) for a prompt that cannot be tokenized; cut to
        `truncate_prompt_tokens` (`truncated`)."""
        return truncated(self._ids(msg), msg.params)

    def _ids(self, msg: TokenizeMsg) -> list[int]:
        if msg.input_ids is not None:
            return list(msg.input_ids)
        if msg.chat is not None:
            return self.chat_ids(msg.chat, msg.tools, msg.add_generation_prompt,
                                 msg.continue_final_message, msg.template_kwargs)
        assert msg.text is not None, "TokenizeMsg without a prompt"
        return self.tokenizer.encode(msg.text)

    def chat_ids(self, chat: list[dict], tools_json: str | None = None,
                 add_generation_prompt: bool = True, continue_final_message: bool = False,
                 kwargs_json: str | None = None) -> list[int]:
        """A conversation through the model's chat template (with `chat_template_kwargs`, e.g.
        Qwen3's `enable_thinking`); ValueError naming `messages`."""
        if self.tokenizer.chat_template is None:
            raise ValueError("messages cannot be used: this model's tokenizer has no chat template "
                             "(the server's --chat-template gives it one)")
        tools = json.loads(tools_json) if tools_json is not None else None
        extra = json.loads(kwargs_json) if kwargs_json is not None else {}
        try:
            text = self.tokenizer.apply_chat_template(
                template_messages(chat), tools=tools, tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **extra,
            )
        except Exception as e:  # jinja raises for conversations the template forbids
            raise ValueError(f"messages do not fit the model's chat template: {e}") from e
        return self.tokenizer.encode(text, add_special_tokens=False)

    def text_op(self, msg: TextOpMsg) -> TextOpReply:
        """`/tokenize` and `/detokenize`: the answer, or the field at fault and why."""
        tok = self.tokenizer
        try:
            if msg.op == "detokenize":
                assert msg.tokens is not None
                if any(not 0 <= t < len(tok) for t in msg.tokens):
                    return TextOpReply(msg.uid, error=f"tokens: token ids must be in [0, {len(tok)})",
                                       param="tokens")
                return TextOpReply(msg.uid, text=tok.decode(msg.tokens))
            if msg.chat is not None:
                return TextOpReply(msg.uid, tokens=self.chat_ids(
                    msg.chat, None, msg.add_generation_prompt, msg.continue_final_message,
                    msg.template_kwargs))
            assert msg.text is not None, "TextOpMsg without a prompt"
            return TextOpReply(msg.uid, tokens=tok.encode(msg.text, add_special_tokens=msg.add_special_tokens))
        except ValueError as e:
            return TextOpReply(msg.uid, error=str(e), param="messages")
