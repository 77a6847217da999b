"""What a narrower KV cache costs in accuracy, measured through the engine against the model-dtype
cache on the same weights:

- **teacher-forced**, on a fixed text prefilled `chunk` tokens at a time into one request's KV,
  so every chunk after the first attends over the earlier chunks' keys and values as the cache
  stores them (FP8 included): the text's **perplexity**, and the **top-1 agreement**, the share of
  positions whose most likely next token is the reference cache's;
- **free-running greedy** `LLM.generate` over many prompts: the **prefix agreement**, the share of
  generated positions that come before their output's first token that differs from the
  reference run (one early divergence costs every position after it); the per-position match
  rate and the count of identical outputs are reported too.

`python -m radixserve.bench.kv_accuracy` prints them for each `--kv-cache-dtype` against `auto`.
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from radixserve.llm import LLM
    from radixserve.scheduler.scheduler import Scheduler

DEFAULT_TEXT = Path("tests/data/fp8_eval_text.txt")


class Agreement(NamedTuple):
    prefix: float  # positions before each output's first mismatch / all positions
    per_position: float  # positions whose tokens are equal / all positions
    identical: int  # outputs equal to the reference from start to end
    total: int  # outputs compared


class TeacherForced(NamedTuple):
    nll: torch.Tensor  # [n - 1] float32: -log p(ids[i + 1] | ids[: i + 1])
    top1: torch.Tensor  # [n - 1] int64: the most likely next token after ids[: i + 1]

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll.mean().item())


@torch.inference_mode()
def teacher_forced(sched: Scheduler, ids: Sequence[int], chunk: int = 256) -> TeacherForced:
    """`ids` prefilled `chunk` tokens at a time into one request's KV (slots from the scheduler's
    cache manager, freed after); every position's NLL of the next token, and its argmax."""
    from radixserve.core.batch import Batch

    if sched.has_work:
        raise RuntimeError("teacher_forced needs an idle scheduler")
    eng, n, dev = sched.engine, len(ids), sched.device
    slots = sched.cache.allocate(n)
    if slots is None or n > sched.table.max_seq_len:
        raise ValueError(f"{n} tokens do not fit the KV cache or a request row")
    row = sched.table.alloc_row()
    tokens = torch.tensor(list(ids), device=dev)
    nlls, top1 = [], []
    try:
        sched.table.page_table[row, :n] = slots[:n].to(sched.table.page_table.dtype)
        for start in range(0, n - 1, chunk):
            end = min(start + chunk, n - 1)  # the last token is only ever a target
            batch = Batch(
                "prefill", tokens[start:end], torch.arange(start, end, device=dev),
                slots[start:end].to(dev), torch.tensor([row], device=dev),
                torch.tensor([end], dtype=torch.int32, device=dev),
                torch.tensor([end - start], dtype=torch.int32, device=dev), [end], [end - start],
            )
            logp = torch.log_softmax(eng.model.compute_logits(eng.forward_hidden(batch)).float(), -1)
            nlls.append(-logp.gather(1, tokens[start + 1:end + 1, None])[:, 0])
            top1.append(logp.argmax(-1))
    finally:
        sched.table.free_row(row)
        sched.cache.free(slots)
    return TeacherForced(torch.cat(nlls).cpu(), torch.cat(top1).cpu())


def top1_agreement(reference: TeacherForced, got: TeacherForced) -> float:
    return (reference.top1 == got.top1).float().mean().item()


def agreement(reference: Sequence[Sequence[int]], got: Sequence[Sequence[int]]) -> Agreement:
    assert len(reference) == len(got), (len(reference), len(got))
    prefix = equal = total = identical = 0
    for ref, out in zip(reference, got):
        assert len(ref) == len(out), "compare outputs of equal length (ignore_eos)"
        same = [a == b for a, b in zip(ref, out)]
        prefix += same.index(False) if False in same else len(same)
        equal += sum(same)
        total += len(same)
        identical += all(same)
    return Agreement(prefix / total, equal / total, identical, len(reference))


def text_prompts(ids: Sequence[int], num: int, min_len: int = 24, max_len: int = 96) -> list[list[int]]:
    """`num` prompts cut from the text at evenly spread offsets, lengths cycling min..max."""
    span = len(ids) - max_len
    if num < 1 or span < num:
        raise ValueError(f"a text of {len(ids)} tokens cannot give {num} prompts of <= {max_len}")
    lens = [min_len + (max_len - min_len) * i // max(num - 1, 1) for i in range(num)]
    return [list(ids[i * span // num:i * span // num + n]) for i, n in enumerate(lens)]


def greedy_tokens(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """One batched greedy `generate` (EOS ignored, so every output has `max_tokens` tokens)."""
    from radixserve.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [r.token_ids for r in llm.generate(prompts, params)]


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from radixserve.llm import LLM
    from radixserve.models.default_model import resolve_model_path

    p = argparse.ArgumentParser(prog="python -m radixserve.bench.kv_accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--kv-cache-dtype", nargs="+", default=["fp8_e4m3"], help="each against auto")
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    p.add_argument("--chunk", type=int, default=256, help="prefill chunk of the teacher-forced run")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)

    path = resolve_model_path(args.model)
    ids = AutoTokenizer.from_pretrained(path).encode(args.text.read_text())
    prompts = text_prompts(ids, args.num_prompts)
    print(f"model {path.name} ({args.dtype}, {args.device}); text {args.text} ({len(ids)} tokens, "
          f"chunks of {args.chunk}); {len(prompts)} prompts x {args.max_tokens} greedy tokens")
    ref_tf = ref_gen = None
    for kv in ("auto", *args.kv_cache_dtype):
        t0 = time.perf_counter()
        llm = LLM(str(path), dtype=args.dtype, device=args.device, kv_cache_dtype=kv,
                  max_kv_tokens=max(len(ids), len(prompts) * (96 + args.max_tokens)) + 64)
        tf = teacher_forced(llm.scheduler, ids, args.chunk)
        gen = greedy_tokens(llm, prompts, args.max_tokens)
        line = f"kv {kv:<9} perplexity {tf.perplexity:8.4f}"
        if ref_tf is None or ref_gen is None:
            ref_tf, ref_gen = tf, gen
        else:
            a = agreement(ref_gen, gen)
            line += (f" ({100 * (tf.perplexity / ref_tf.perplexity - 1):+.3f}%), top-1 "
                     f"{100 * top1_agreement(ref_tf, tf):.2f}%, greedy prefix {100 * a.prefix:.2f}%,"
                     f" per position {100 * a.per_position:.2f}%, identical {a.identical}/{a.total}")
        print(f"{line}   [{time.perf_counter() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
