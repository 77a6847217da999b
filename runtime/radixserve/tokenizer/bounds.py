"""How much text one token can stand for, so a prompt too long for the context is refused by its
character count, before it is tokenized (tokenizing 40 MB of text takes minutes of CPU)."""
from __future__ import annotations

from typing import Any


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters of text one token stands for: the longest entry of the vocabulary,
    added tokens included. A vocabulary entry is never shorter than the text it stands for
    (byte-level BPE spells each byte with one character, byte fallback as `<0xE9>`, WordPiece
    adds `##`), so a prompt of more than `context × this` characters cannot fit the context."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1)
