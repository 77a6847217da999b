"""LoRA adapters on CUDA in float32: a batch mixing several PEFT adapters' requests and the base
model's, through the Triton LoRA kernels, decode CUDA graphs (their LoRA and base variants) and
prefill graphs, gives PEFT's greedy tokens for each request; again through the prefix cache, and
with one slot for three adapters. Every graph variant is used: the base-only batches replay the
graphs without LoRA kernels."""
from __future__ import annotations

import gc

import pytest

from tests.peft_adapters import ADAPTERS, peft_greedy, write_adapters
from tests.runtime.helpers import random_prompts

pytestmark = pytest.mark.gpu
MAX_NEW = 10
PROMPTS = random_prompts(4, [5, 23, 40, 71], 300, seed=21)


@pytest.fixture(scope="module")
def case(tiny_ckpts, tmp_path_factory):
    base = tiny_ckpts["qwen3"]
    adapters = write_adapters(base, tmp_path_factory.mktemp("lora-gpu"))
    want = {name: peft_greedy(base, adapters.get(name), PROMPTS, MAX_NEW) for name in (None, *ADAPTERS)}
    return base, adapters, want


@pytest.mark.parametrize("slots,page_size", [(8, 1), (1, 16)])
def test_mixed_adapters_on_cuda_equal_peft(case, slots: int, page_size: int) -> None:
    from radixserve import LLM, SamplingParams

    base, adapters, want = case
    llm = LLM(str(base), dtype="float32", device="cuda", page_size=page_size,
              max_loras_per_batch=slots, lora_paths=[f"{n}={p}" for n, p in adapters.items()])
    sched = llm.scheduler
    runner = sched.engine.graph_runner
    assert runner is not None and runner.graphs[(True, False)].keys() == runner.graphs[(False, False)].keys()
    assert sched.engine.prefill_graphs is not None
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    for run in range(2):  # cold, then through the prefix cache
        uids = {}
        for name in (None, *ADAPTERS):
            for i, p in enumerate(PROMPTS):
                uid = 1000 * run + len(uids)
                sched.add_request(uid, p, sp, lora=name)
                uids[uid] = (name, i)
        out: dict[int, list[int]] = {}
        while sched.has_work:
            for o in sched.step():
                out.setdefault(o.uid, []).append(o.token_id)
        for uid, (name, i) in uids.items():
            assert out[uid] == want[name][i], f"{name or 'base'}, prompt {i}"
    assert [r.token_ids for r in llm.generate(PROMPTS, sp)] == want[None]  # base-only graphs
    sched.check_integrity()
    del llm, sched, runner
    gc.collect()
