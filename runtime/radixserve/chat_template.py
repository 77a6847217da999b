"""`--chat-template`'s value read: a file's text or the template itself, parsed before any
process starts (transformers renders templates in the same sandboxed Jinja environment)."""
from __future__ import annotations

from pathlib import Path


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
