"""Where an adapter is: a directory, or a Hugging Face hub id fetched into the hub cache. Light
(no torch), so the API process resolves an adapter to load off its event loop before the
scheduler reads it."""
from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class AdapterError(ValueError):
    """An adapter that cannot be loaded or unloaded; the message says why, `status` is the HTTP
    status it answers (400: a bad adapter or name, 404: none of that name)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def resolve_adapter_dir(source: str | Path) -> Path:
    """An adapter's directory: `source` itself when it is one, else a Hugging Face hub id
    fetched (its config and safetensors only, from the repo's main branch) into the hub cache,
    or found there under HF_HUB_OFFLINE (where the operator's init container put it)."""
    path = Path(source).expanduser()
    text = str(source)
    if path.is_dir() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(text, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE]))
    # the hub's errors are OSErrors (HTTP, not in the cache) or ValueErrors (not an id), and any
    # network error below them: each this adapter's 400, the server unharmed
    except (OSError, ValueError) as e:
        raise AdapterError(f"{text}: not a local directory, and not fetched from the Hugging Face "
                           f"hub ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                           ) from None
