"""Prompt → token ids: chat messages through the tokenizer's own chat template, plain text with the
tokenizer's special tokens, token ids as given."""
from __future__ import annotations

from radixserve.messages import TokenizeMsg


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
            try:
                text = self.tokenizer.apply_chat_template(
                    msg.chat, tokenize=False, add_generation_prompt=True
                )
            except Exception as e:  # jinja raises for conversations the template forbids
                raise ValueError(f"messages do not fit the model's chat template: {e}") from e
            return self.tokenizer.encode(text, add_special_tokens=False)
        assert msg.text is not None, "TokenizeMsg without a prompt"
        return self.tokenizer.encode(msg.text)
