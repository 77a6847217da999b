"""The tokenizer every process loads, with the chat template the server was given in place of the
checkpoint's (vLLM's and SGLang's `--chat-template`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_chat_template(value: str) -> str:
    """`--chat-template`: a file's text, or `value` itself where it is a Jinja template (holds
    `{{` or `{%`). ValueError where it is neither or does not parse, before any process starts."""
    path = Path(value).expanduser()
    if path.is_file():
        text = path.read_text()
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ValueError(f"{value!r} is neither a file nor a Jinja template")
    # transformers renders templates in this environment (utils/chat_template_utils.py)
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except TemplateSyntaxError as e:
        raise ValueError(f"the chat template does not parse: {e.message} (line {e.lineno})") from None
    return text


PROCESSOR_TEMPLATE = "chat_template.json"  # a multimodal checkpoint's processor's template


def load_tokenizer(model_path: str, chat_template: str | None = None) -> Any:
    """The checkpoint's tokenizer; `chat_template` (a template's text) replaces its own. Where
    the tokenizer has none, the processor's (`chat_template.json`, which multimodal checkpoints
    carry and transformers' tokenizer does not read) is used."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    elif tokenizer.chat_template is None and (Path(model_path) / PROCESSOR_TEMPLATE).is_file():
        tokenizer.chat_template = json.loads((Path(model_path) / PROCESSOR_TEMPLATE).read_text())["chat_template"]
    return tokenizer
