"""`--dummy-loras N`: the benches' LoRA adapters, random ones of the model's exact shapes (rank
`--max-lora-rank`, every linear projection of every decoder layer), written as PEFT adapters
so that the engine reads them as it reads any (through the same load path on every TP rank);
and the workload's requests spread over them in turn."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from radixserve.bench.workload import BenchRequest
from radixserve.layers.lora import LoRATarget, full_shape, lora_parts
from radixserve.lora.source import CONFIG_FILE, WEIGHTS_FILE
from radixserve.models.loader import meta_model
from radixserve.models.weights import WeightNameMap

DEFAULT_RANK = 16  # vLLM's default --max-lora-rank, and the benchmark


def write_dummy_adapters(model_dir: Path, root: Path, count: int, rank: int,
                         file_dtype: torch.dtype = torch.bfloat16) -> dict[str, str]:
    """`count` random adapters for the model in `model_dir`, under `root`: name -> directory."""
    from safetensors.torch import save_file

    model = meta_model(model_dir)
    names: WeightNameMap = getattr(model, "weight_names", WeightNameMap())
    targets = [(name, layer, part) for name, layer in model.named_modules()
               if isinstance(layer, LoRATarget) for part in lora_parts(layer)]
    out = {}
    for i in range(count):
        g = torch.Generator().manual_seed(i)
        tensors, modules = {}, set()
        for name, layer, part in targets:
            hf = names.to_hf(f"{name}.weight", part).removesuffix(".weight")
            fan_out, fan_in = full_shape(layer, part)
            # updates a fraction of the weights' size: they change the tokens, and the activations stay
            # in range over many layers
            tensors[f"base_model.model.{hf}.lora_A.weight"] = (
                torch.randn(rank, fan_in, generator=g) * fan_in**-0.5).to(file_dtype)
            tensors[f"base_model.model.{hf}.lora_B.weight"] = (
                torch.randn(fan_out, rank, generator=g) * 0.3 * rank**-0.5).to(file_dtype)
            modules.add(hf.rsplit(".", 1)[-1])
        path = root / f"dummy-{i}"
        path.mkdir(parents=True)
        (path / CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "r": rank,
                                                    "lora_alpha": rank,
                                                    "target_modules": sorted(modules)}))
        save_file(tensors, str(path / WEIGHTS_FILE))
        out[path.name] = str(path)
    return out


def spread(reqs: list[BenchRequest], adapters: list[str]) -> list[BenchRequest]:
    """The same requests, request i running with adapter i mod len(adapters)."""
    return [r._replace(lora=adapters[i % len(adapters)]) for i, r in enumerate(reqs)]
