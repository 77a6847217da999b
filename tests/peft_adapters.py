"""LoRA adapters built by PEFT itself on a tiny checkpoint (random A and B, so each changes the
model's tokens), and PEFT's own greedy tokens with them, unmerged or merged into the weights:
the reference every LoRA test compares radixserve's tokens with."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# (name, LoraConfig keywords): ranks, targets, scalings and per-module overrides that differ
ADAPTERS: dict[str, dict[str, Any]] = {
    "sql": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"],
            "use_rslora": True, "rank_pattern": {"v_proj": 4}},
    "chat": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"],
             "alpha_pattern": {"o_proj": 2}},
    "mlp": {"r": 16, "lora_alpha": 32, "target_modules": ["gate_proj", "up_proj"]},
}


def write_peft_adapter(base: Path, out: Path, seed: int, **config: Any) -> Path:
    """A PEFT LoRA adapter of `base` with random A and B (`init_lora_weights=False`), saved by
    PEFT to `out` (adapter_config.json + adapter_model.safetensors)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    get_peft_model(model, LoraConfig(init_lora_weights=False, **config)).save_pretrained(out)
    return out


def write_adapters(base: Path, root: Path) -> dict[str, Path]:
    """Every adapter of `ADAPTERS` for `base`, under `root`."""
    return {name: write_peft_adapter(base, root / name, seed, **cfg)
            for seed, (name, cfg) in enumerate(ADAPTERS.items())}


def _greedy(model: Any, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_new, eos_token_id=None, do_sample=False,
                             pad_token_id=0)
        outs.append(gen[0, len(p):].tolist())
    return outs


@torch.inference_mode()
def peft_greedy(base: Path, adapter: Path | None, prompts: list[list[int]],
                max_new: int) -> list[list[int]]:
    """transformers + PEFT `generate`, greedy, EOS ignored, one prompt at a time, with the
    adapter on top of the model (PEFT's forward); the base model alone for `adapter` None."""
    return peft_greedy_both(base, adapter, prompts, max_new)[0]


@torch.inference_mode()
def peft_greedy_both(base: Path, adapter: Path | None, prompts: list[list[int]],
                     max_new: int) -> tuple[list[list[int]], list[list[int]] | None]:
    """`peft_greedy`'s tokens, and then those of the adapter merged into the weights
    (`merge_and_unload`; None for the base model)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter is None:
        return _greedy(model, prompts, max_new), None
    model = PeftModel.from_pretrained(model, adapter).eval()
    unmerged = _greedy(model, prompts, max_new)
    return unmerged, _greedy(model.merge_and_unload(), prompts, max_new)
