"""The model's end-of-sequence ids, from config.json and generation_config.json together."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _as_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def _generation_config(model_dir: Path) -> Any:
    """The checkpoint's GenerationConfig, or None without generation_config.json."""
    from transformers import GenerationConfig

    if not (model_dir / "generation_config.json").exists():
        return None
    return GenerationConfig.from_pretrained(model_dir)


def eos_token_ids(model_dir: str | Path, cfg: Any = None) -> set[int]:
    """Every EOS id the model declares (Llama-3 Instruct, for one, lists several in its
    generation config only; a multimodal config and its `text_config` may each list some).
    `cfg`: the checkpoint's transformers config where the caller has it (else read here)."""
    from transformers import AutoConfig

    from radixserve.models.hf_config import text_config

    model_dir = Path(model_dir)
    if cfg is None:
        cfg = AutoConfig.from_pretrained(model_dir)
    ids = set().union(*(_as_set(getattr(c, "eos_token_id", None)) for c in (cfg, text_config(cfg))))
    gen = _generation_config(model_dir)
    return ids | (_as_set(gen.eos_token_id) if gen is not None else set())


# the sampling fields a model's generation config may recommend (vLLM and SGLang apply the same)
SAMPLING_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(model_dir: str | Path) -> dict[str, float | int]:
    """The sampling values the model's generation_config.json sets away from transformers'
    defaults (Qwen3's temperature 0.6, top_p 0.95, top_k 20): the server's defaults for requests
    that leave those fields out. Empty without the file."""
    gen = _generation_config(Path(model_dir))
    if gen is None:
        return {}
    diff = gen.to_diff_dict()
    out = {k: diff[k] for k in SAMPLING_DEFAULT_FIELDS if diff.get(k) is not None}
    if out.get("top_k") == 0:  # transformers' "no top-k filter" is our -1 (0 is refused)
        out["top_k"] = -1
    return out
