"""Prompt → token ids: chat messages through the tokenizer's own chat template (with the request's
tools, as transformers passes them), plain text with the tokenizer's special tokens, token ids as
given."""
from __future__ import annotations

import json

from radixserve.messages import TokenizeMsg


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


class TokenizeManager:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def tokenize(self, msg: TokenizeMsg) -> list[int]:
        """ValueError (naming the field) for a prompt that cannot be tokenized."""
        if msg.input_ids is not None:
            return list(msg.input_ids)
        if msg.chat is not None:
            if self.tokenizer.chat_template is None:
                raise ValueError("messages cannot be used: this model's tokenizer has no chat template")
            tools = json.loads(msg.tools) if msg.tools is not None else None
            try:
                text = self.tokenizer.apply_chat_template(
                    template_messages(msg.chat), tools=tools, tokenize=False, add_generation_prompt=True
                )
            except Exception as e:  # jinja raises for conversations the template forbids
                raise ValueError(f"messages do not fit the model's chat template: {e}") from e
            return self.tokenizer.encode(text, add_special_tokens=False)
        assert msg.text is not None, "TokenizeMsg without a prompt"
        return self.tokenizer.encode(msg.text)
