"""Whether a model splits into `--tp` shards: plain arithmetic on its config, so the command line
checks it before torch is imported or any process starts."""
from __future__ import annotations


def validate_tp(tp: int, hf_config) -> None:
    """Clear errors before any process starts. `hf_config`: a transformers config or
    config.json's fields (a multimodal one's `text_config` is read)."""
    from radixserve.models.hf_config import text_config

    hf_config = text_config(hf_config)
    heads, kv = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if heads % tp:
        raise ValueError(f"--tp {tp} must divide the model's {heads} attention heads")
    if kv % tp and tp % kv:
        raise ValueError(f"--tp {tp} must divide the model's {kv} KV heads or be a multiple of them")
    inter = getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size
    if inter % tp:
        raise ValueError(f"--tp {tp} must divide the intermediate size {inter}")
