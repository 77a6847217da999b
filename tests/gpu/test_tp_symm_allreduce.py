"""The symmetric-memory all-reduce on CUDA at TP=2, each mode in a fresh process (a process makes
its buffer once; a later group there uses NCCL): the group makes the buffer (NVLink peer memory,
no multicast) and picks the one-shot kernel for decode-sized messages; with auto, with each kernel
forced and with NCCL forced, captured in the decode CUDA graphs, TP=2 gives the TP=1 greedy
tokens in float32, cold and from the prefix cache; a second group in the same process falls back
to NCCL and still gives them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixserve import LLM, SamplingParams
from tests.runtime.helpers import random_prompts

GPUS = torch.cuda.device_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS < 2, reason=f"TP=2 needs >= 2 CUDA devices, found {GPUS}"),
]
PROMPTS = random_prompts(6, [1, 9, 40, 77, 130, 16], 300, seed=11)
KW = {"dtype": "float32", "device": "cuda", "page_size": 16, "max_prefill_length": 32,
      "max_running_requests": 8}
ROOT = Path(__file__).resolve().parents[2]

# runs in a fresh process: two TP=2 groups, one after the other; prints what each used and gave
CHILD = """
import json, sys, torch
from radixserve import LLM, SamplingParams
from radixserve.distributed import get_comm
ckpt, kw, prompts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
sp = SamplingParams(max_tokens=10, ignore_eos=True)
out = []
for _ in range(2):
    llm = LLM(ckpt, tp=2, **kw)
    try:
        comm = get_comm()
        x = torch.zeros(8, 64, device="cuda:0")
        out.append({"graphs": llm.scheduler.engine.graph_runner is not None,
                    "fast": comm.fast is not None, "kind": comm.all_reduce_kind(x),
                    "kind_fp16": comm.all_reduce_kind(x.half()),
                    "tokens": [[r.token_ids for r in llm.generate(prompts, sp)] for _ in range(2)]})
    finally:
        llm.close()
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def want(tiny_ckpts) -> list[list[int]]:
    sp = SamplingParams(max_tokens=10, ignore_eos=True)
    return [r.token_ids for r in LLM(str(tiny_ckpts["llama"]), **KW).generate(PROMPTS, sp)]


@pytest.mark.parametrize("mode", ["auto", "one_shot", "two_shot", "nccl"])
def test_tp2_equals_tp1_with_each_all_reduce(tiny_ckpts, want, mode) -> None:
    env = {**os.environ, "RADIXSERVE_ALLREDUCE": mode,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tiny_ckpts["llama"]), json.dumps(KW),
                           json.dumps(PROMPTS)], check=False, env=env, capture_output=True,
                          text=True, timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    first, second = json.loads(lines[-1].removeprefix("RESULT "))
    assert first["graphs"], "decode graphs must be captured"
    if mode == "nccl":
        assert not first["fast"] and first["kind"] == "nccl"
    else:
        assert first["fast"], f"symmetric memory was not set up: {proc.stderr[-3000:]}"
        assert first["kind"] == ("one_shot" if mode == "auto" else mode)
        assert first["kind_fp16"] == "nccl"
    assert not second["fast"] and second["kind"] == "nccl", "a second group in a process uses NCCL"
    for run in (first, second):
        assert run["tokens"] == [want, want], f"{mode}: TP=2 tokens differ from TP=1"
