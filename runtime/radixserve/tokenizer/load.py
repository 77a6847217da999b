"""The tokenizer every process loads, with the chat template the server was given in place of the
checkpoint's (vLLM's and SGLang's `--chat-template`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROCESSOR_TEMPLATE = "chat_template.json"  # a multimodal checkpoint's processor's template


def _tokenizer_class(model_path: Path) -> Any:
    """The class `AutoTokenizer` would pick for the checkpoint, taken straight from transformers
    where tokenizer_config.json names it (its fast variant first, as AutoTokenizer prefers).
    NOTE: AutoTokenizer reads the model's config to decide, and transformers' configuration
    module imports torch: ~250 MB resident in every tokenizer process for nothing."""
    import transformers

    try:
        name = json.loads((model_path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        name = None
    if isinstance(name, str) and name.isidentifier():
        for candidate in (name if name.endswith("Fast") else f"{name}Fast", name):
            cls = getattr(transformers, candidate, None)
            if isinstance(cls, type) and hasattr(cls, "from_pretrained"):
                return cls
    return transformers.AutoTokenizer


def load_tokenizer(model_path: str, chat_template: str | None = None) -> Any:
    """The checkpoint's tokenizer; `chat_template` (a template's text) replaces its own. Where
    the tokenizer has none, the processor's (`chat_template.json`, which multimodal checkpoints
    carry and transformers' tokenizer does not read) is used."""
    tokenizer = _tokenizer_class(Path(model_path)).from_pretrained(model_path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    elif tokenizer.chat_template is None and (Path(model_path) / PROCESSOR_TEMPLATE).is_file():
        tokenizer.chat_template = json.loads((Path(model_path) / PROCESSOR_TEMPLATE).read_text())["chat_template"]
    return tokenizer
