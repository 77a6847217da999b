"""`--dummy-loras N` of `radixserve bench offline|latency` on CPU: the dummy adapters are PEFT
files of the model's shapes the engine reads like any (every projection of every layer, the rank
asked for), each one changes the model's tokens, and the benches time the LoRA run beside the
base model's on the same requests."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from radixserve import LLM, SamplingParams
from radixserve.bench.lora import spread, write_dummy_adapters
from radixserve.bench.workload import random_workload
from radixserve.cli import main
from tests.doc_commands import bad_commands
from tests.runtime.test_bench_offline import ARGS, tok_s

ROOT = Path(__file__).resolve().parents[2]


def test_dummy_adapters_cover_every_projection_and_change_the_tokens(tiny_ckpts, tmp_path) -> None:
    model = tiny_ckpts["qwen3"]
    paths = write_dummy_adapters(model, tmp_path, 2, rank=8, file_dtype=torch.float32)
    llm = LLM(str(model), dtype="float32", device="cpu", max_lora_rank=8,
              lora_paths=[f"{n}={p}" for n, p in paths.items()])
    for name, (adapter, _) in llm.scheduler.lora.served.items():
        assert adapter.rank == 8
        assert {m for m, _ in adapter.weights} == set(llm.scheduler.lora.pool.layers), name
    prompt = [[5, 17, 33, 9, 120, 41]]
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    outs = [llm.generate(prompt, sp, lora=name)[0].token_ids for name in (None, *paths)]
    assert outs[0] != outs[1] and outs[1] != outs[2]


def test_the_lora_docs_commands_parse() -> None:
    assert not bad_commands(ROOT / "docs" / "lora.md")


def test_spread_gives_the_adapters_in_turn() -> None:
    reqs = spread(random_workload(5, (2, 4), (1, 2), 100), ["a", "b"])
    assert [r.lora for r in reqs] == ["a", "b", "a", "b", "a"]


def test_offline_times_the_loras_beside_the_base_model(tiny_ckpts, capsys) -> None:
    argv = [*ARGS, "--model", str(tiny_ckpts["qwen3"]), "--dummy-weights", "--baseline", "none",
            "--dummy-loras", "3", "--max-lora-rank", "4", "--max-loras-per-batch", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    base, lora = tok_s(out, "radixserve"), tok_s(out, "radixserve 3 LoRAs")
    assert "LoRA 3 adapters in 2 slots of rank 4" in out
    ratio = float(re.search(r"^ratio LoRA/base\s+([\d.]+)x", out, re.MULTILINE).group(1))
    assert ratio == pytest.approx(lora / base, rel=0.01)


def test_latency_times_each_batch_size_with_the_loras(tiny_ckpts, capsys) -> None:
    argv = ["bench", "latency", "--model", str(tiny_ckpts["qwen3"]), "--device", "cpu",
            "--dummy-weights", "--dummy-loras", "2", "--batch-sizes", "1", "3", "--steps", "2",
            "--input-len", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for bs in (1, 3):
        base = float(re.search(rf"^batch\s+{bs}:\s+([\d.]+) ms/step", out, re.MULTILINE).group(1))
        m = re.search(rf"^batch\s+{bs} LoRA:\s+([\d.]+) ms/step .* ([\d.]+)x the base", out,
                      re.MULTILINE)
        assert m, out
        assert float(m.group(2)) == pytest.approx(float(m.group(1)) / base, rel=0.01)
