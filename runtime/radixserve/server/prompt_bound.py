"""A prompt's length checked by its characters before it is tokenized: a text longer than the
context times the most characters one token stands for (`tokenizer/bounds.py`) cannot fit, so it
is refused at once instead of after minutes of tokenizing. The check is a necessary condition
only; the scheduler still checks the token count exactly."""
from __future__ import annotations

from typing import NamedTuple

from radixserve.server.errors import APIError


def chat_chars(chat: list[dict]) -> int:
    """The characters of a conversation's contents: the chat template renders each of them."""
    return sum(len(m.get("content") or "") for m in chat)


class PromptBound(NamedTuple):
    max_seq_len: int  # the context, in tokens
    max_token_chars: int  # the most characters of text one token stands for

    @property
    def max_chars(self) -> int:
        return self.max_seq_len * self.max_token_chars

    def check(self, text: str | None, chat: list[dict] | None) -> None:
        """A 400 naming `prompt` or `messages` (OpenAI's `context_length_exceeded`) when the text
        has more characters than the context can hold."""
        chars = len(text) if text is not None else chat_chars(chat) if chat is not None else 0
        if chars <= self.max_chars:
            return
        field = "prompt" if text is not None else "messages"
        raise APIError(400, f"This model's maximum context length is {self.max_seq_len} tokens and one token "
                            f"stands for at most {self.max_token_chars} characters, but the {field} "
                            f"{'is' if text is not None else 'are'} {chars} characters long (more than "
                            f"{self.max_chars}); shorten it",
                       field, "context_length_exceeded")
