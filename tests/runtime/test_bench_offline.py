"""`radixserve bench offline` end to end on CPU: every configuration it times produces exactly the
requested tokens (the bench asserts it), the TP=2 group starts and stops once per configuration,
and the report carries the lines a reader compares."""
from __future__ import annotations

import re

import pytest

from radixserve.cli import main

ARGS = ["bench", "offline", "--device", "cpu", "--dtype", "float32", "--num-prompts", "6",
        "--input-len", "4", "40", "--output-len", "3", "9", "--warmup", "2"]


def tok_s(out: str, label: str) -> float:
    m = re.search(rf"^{re.escape(label)}\s+([\d.]+) output tok/s", out, re.MULTILINE)
    assert m, f"no {label!r} line in:\n{out}"
    return float(m.group(1))


def test_ablation_and_baseline_report(tiny_ckpts, capsys) -> None:
    assert main([*ARGS, "--model", str(tiny_ckpts["llama"]), "--ablate"]) == 0
    out = capsys.readouterr().out
    ours = tok_s(out, "radixserve")
    assert ours > 0
    for label in ("  overlap off", "  cuda graphs off", "  naive cache"):
        assert tok_s(out, label) > 0
    assert "cache naive" in out and "overlap off" in out
    hf = tok_s(out, "transformers generate")
    ratio = float(re.search(r"ratio radixserve/transformers\s+([\d.]+)x", out).group(1))
    assert ratio == pytest.approx(ours / hf, rel=0.01)


def test_tp2_runs_each_configuration_in_its_own_group(tiny_ckpts, capsys) -> None:
    argv = [*ARGS, "--model", str(tiny_ckpts["qwen3"]), "--tp", "2", "--baseline", "none", "--ablate"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("tp 2,") == 4  # radixserve and its three ablations, each a fresh TP group
    assert tok_s(out, "radixserve") > 0
    assert "transformers" not in out
