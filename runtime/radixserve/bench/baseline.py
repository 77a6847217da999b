"""The same requests through Hugging Face transformers `generate` (left-padded batches)."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from radixserve.bench.workload import BenchRequest
from radixserve.models.multimodal import is_multimodal


def load_hf_model(model_path: Path, dtype: torch.dtype, device: torch.device, dummy: bool):
    """transformers' model of the checkpoint: its causal LM, or for a multimodal checkpoint
    (served text-only here) its image-text-to-text class, vision tower included, as its users
    would run it."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = AutoConfig.from_pretrained(model_path)
    auto = AutoModelForImageTextToText if is_multimodal(cfg) else AutoModelForCausalLM
    if dummy:
        with torch.device(device):
            model = auto.from_config(cfg, dtype=dtype)
    else:
        model = auto.from_pretrained(model_path, dtype=dtype).to(device)
    return model.eval()


@torch.inference_mode()
def run_transformers(model, reqs: list[BenchRequest], batch_size: int, pad_id: int) -> tuple[float, int]:
    """Returns (seconds, output tokens requested). Each batch generates its longest output length
    for every row (generate has one length per batch); only requested tokens are counted."""
    dev = next(model.parameters()).device
    start = time.perf_counter()
    total = 0
    for i in range(0, len(reqs), batch_size):
        chunk = reqs[i : i + batch_size]
        width = max(len(r.input_ids) for r in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(chunk):
            ids[j, width - len(r.input_ids):] = torch.tensor(r.input_ids)
            mask[j, width - len(r.input_ids):] = 1
        new = max(r.output_len for r in chunk)
        t0 = time.perf_counter()
        model.generate(
            input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=new,
            min_new_tokens=new, do_sample=False, pad_token_id=pad_id,
        )
        total += sum(r.output_len for r in chunk)
        # this baseline runs for minutes: show each batch as it ends
        print(f"  transformers batch {i // batch_size + 1}/{-(-len(reqs) // batch_size)}: "
              f"{len(chunk)} requests x {new} new tokens, {time.perf_counter() - t0:.1f} s", flush=True)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, total
