from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import torch


def fast_corners(grid: Iterable[tuple], fast: set[tuple]) -> list:
    """A parametrize grid whose cases outside `fast` are `slow`: `make test-fast` runs the
    corners, `make test` the whole grid."""
    return [pytest.param(*case, marks=() if case in fast else pytest.mark.slow) for case in grid]


def random_prompts(n: int, lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


@torch.inference_mode()
def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new: int,
              dtype: torch.dtype = torch.float32, device: str = "cpu",
              model_class: str = "AutoModelForCausalLM") -> list[list[int]]:
    """transformers `generate` (of `model_class`, a transformers class name), one prompt at a
    time (no padding), EOS ignored (eos_token_id=None; min_new_tokens would instead *ban* EOS ids
    and change the greedy choice)."""
    import transformers

    cls = getattr(transformers, model_class)
    model = cls.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    outs = []
    for p in prompts:
        ids = torch.tensor([p], device=device)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             eos_token_id=None, do_sample=False, pad_token_id=0)
        outs.append(gen[0, len(p):].tolist())
    return outs


def greedy_reference(ckpts: dict[str, Path], lengths: list[int], max_new: int) -> dict[str, tuple]:
    """Per architecture: 8 random prompts of the given lengths and transformers' fp32 greedy tokens."""
    from transformers import AutoConfig

    out = {}
    for seed, (arch, path) in enumerate(ckpts.items()):
        prompts = random_prompts(8, lengths, AutoConfig.from_pretrained(path).vocab_size, seed=seed)
        out[arch] = (prompts, hf_greedy(path, prompts, max_new))
    return out


@torch.inference_mode()
def prefill_logits(engine, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Every position's float32 logits of one prefill batch holding all `prompts`, through the
    engine's attention backend and KV pool (each prompt on its own row and fresh pages)."""
    from radixserve.core.batch import Batch

    dev, page = engine.device, engine.page_size
    lens = [len(p) for p in prompts]
    rows, slots, base = [], [], 0
    for n in lens:
        row = engine.table.alloc_row()
        s = torch.arange(base, base + n, device=dev)
        engine.table.page_table[row, :n] = s.to(torch.int32)
        rows.append(row)
        slots.append(s)
        base += -(-n // page) * page
    batch = Batch(
        "prefill", torch.tensor([t for p in prompts for t in p], device=dev),
        torch.cat([torch.arange(n, device=dev) for n in lens]), torch.cat(slots),
        torch.tensor(rows, device=dev), torch.tensor(lens, dtype=torch.int32, device=dev),
        torch.tensor(lens, dtype=torch.int32, device=dev), list(lens), list(lens),
    )
    hidden = engine.forward_hidden(batch)
    return list(engine.model.compute_logits(hidden).float().split(lens))


def drain(s, limit: int = 10_000, every_step: bool = False) -> dict[int, list]:
    """Step the scheduler `s` until it has no work; its outputs per uid. Checks that it ends
    with nothing held (KV and rows all returned, no request left running or waiting), and with
    `every_step` its books after each step too (no slot or row leaked or held twice)."""
    out: dict[int, list] = {}
    for _ in range(limit):
        if not s.has_work:
            s.check_integrity()
            assert s.stats()["running"] == s.stats()["waiting"] == 0
            return out
        for o in s.step():
            out.setdefault(o.uid, []).append(o)
        if every_step:
            s.check_integrity()
    raise AssertionError("scheduler did not drain")


def spy_batches(monkeypatch) -> list[tuple[list[int], list[bool], bool]]:
    """Record every batch the scheduler builds from now on: its extend lengths, which of its
    requests had their whole prompt computed before it (decode tokens), and whether it is a decode
    batch."""
    from radixserve.scheduler import scheduler as scheduler_mod

    seen: list[tuple[list[int], list[bool], bool]] = []
    real = scheduler_mod.build_batch

    def spy(items, table, device, decode):
        seen.append(([n for _, n in items], [r.kv_len >= r.prompt_len for r, _ in items], decode))
        return real(items, table, device, decode)

    monkeypatch.setattr(scheduler_mod, "build_batch", spy)
    return seen


def mixed_batches(seen: list[tuple[list[int], list[bool], bool]]) -> list[list[int]]:
    """Of `spy_batches`' record: the extend lengths of the batches that carried decode tokens
    beside prompt tokens."""
    return [ext for ext, done, decode in seen if not decode and any(done) and not all(done)]
