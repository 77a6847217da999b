"""A prompt's size checked before it is tokenized, from what the request holds: a text longer than
the context times the most characters one token stands for (`tokenizer/bounds.py`) cannot fit,
so it is refused at once instead of after minutes of tokenizing. For a chat that text is
everything the chat template receives: each message's content, name, tool calls, reasoning and
tool call id, the tools, the template's variables. NOTE: a template may leave some of them out, so
for a chat the bound is a rule, not only a necessary condition: whatever a template writes, no
field it is given may carry more text than the context can hold (a client could otherwise send the
template megabytes it ignores). A conversation of more messages than the context has tokens
cannot fit (every template writes at least a token per message). Token ids are counted as they
are. The scheduler still checks the token count exactly."""
from __future__ import annotations

from typing import Any, NamedTuple

from radixserve.server.errors import APIError


def text_chars(value: Any) -> int:
    """The characters of every string value in `value` (JSON-like: dicts, lists, strings)."""
    chars, stack = 0, [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            chars += len(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return chars


def chat_chars(chat: list[dict], *json_texts: str | None) -> int:
    """What the chat template receives of a conversation: its messages' text and the JSON texts
    beside them (tools, template variables)."""
    return text_chars(chat) + sum(len(t) for t in json_texts if t)


class PromptBound(NamedTuple):
    max_seq_len: int  # the context, in tokens
    max_token_chars: int  # the most characters of text one token stands for

    @property
    def max_chars(self) -> int:
        return self.max_seq_len * self.max_token_chars

    def check(self, text: str | None, chat: list[dict] | None, input_ids: list[int] | None = None,
              tools: str | None = None, template_kwargs: str | None = None,
              truncate: int | None = None) -> None:
        """A 400 naming `prompt` or `messages` (OpenAI's `context_length_exceeded`) when the prompt
        cannot fit the context: too many characters, messages or token ids (ids beyond the
        context are allowed when `truncate`, the tokenizer keeping only the last ones)."""
        if input_ids is not None:
            if truncate is None and len(input_ids) > self.max_seq_len:
                self._refuse("prompt", f"the prompt has {len(input_ids)} tokens")
            return
        if chat is not None and len(chat) > self.max_seq_len:
            self._refuse("messages", f"the conversation has {len(chat)} messages (each is at least a "
                                     "token once the chat template has written it)")
        chars = len(text) if text is not None else chat_chars(chat, tools, template_kwargs) if chat is not None else 0
        if chars <= self.max_chars:
            return
        if text is not None:
            self._refuse("prompt", f"one token stands for at most {self.max_token_chars} characters, but "
                                   f"the prompt is {chars} characters long (more than {self.max_chars})")
        self._refuse("messages", f"one token stands for at most {self.max_token_chars} characters, but the "
                                 f"messages (and tools) are {chars} characters long (more than {self.max_chars})")

    def _refuse(self, field: str, why: str) -> None:
        raise APIError(400, f"This model's maximum context length is {self.max_seq_len} tokens and {why}; "
                            "shorten it", field, "context_length_exceeded")
