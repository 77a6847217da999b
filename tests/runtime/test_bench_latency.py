"""`radixserve bench latency` on CPU: a line per batch size, prompts drawn inside a small model's
vocabulary, `--profile DIR`: a Chrome trace per batch size and the ops of one step, and
`--breakdown`: the eager forward's time by layer part."""
from __future__ import annotations

import json
import re

import pytest

from radixserve.cli import main


def test_latency_with_profile_on_a_small_vocabulary(tiny_ckpts, tmp_path, capsys) -> None:
    from transformers import AutoConfig

    model = tiny_ckpts["llama"]
    cfg = AutoConfig.from_pretrained(model)
    assert cfg.vocab_size < 1000  # the prompts must be drawn below it
    argv = ["bench", "latency", "--model", str(model), "--device", "cpu", "--batch-sizes", "1", "3",
            "--steps", "4", "--input-len", "16", "--profile", str(tmp_path / "prof")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for bs in (1, 3):
        ms = float(re.search(rf"^batch\s+{bs}:\s+([\d.]+) ms/step", out, re.MULTILINE).group(1))
        assert ms > 0
        trace = json.loads((tmp_path / "prof" / f"decode-bs{bs}.json").read_text())
        assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    # per step, not per run: every layer's projections and the LM head, the same count each step
    calls = [float(m) for m in re.findall(r"^\s+[\d.]+\s+([\d.]+)\s+[\d.]+%\s+aten::mm$", out, re.MULTILINE)]
    assert len(calls) == 2 and calls[0] == calls[1] and calls[0] >= cfg.num_hidden_layers
    assert calls[0] == int(calls[0])


def test_latency_runs_each_dummy_quantization(tiny_ckpts, capsys) -> None:
    """`--dummy-quantization none fp8`: the same shapes twice, the second from a block-FP8
    config (on CPU its weights stay in the model dtype: no FP8 weight is kept)."""
    argv = ["bench", "latency", "--model", str(tiny_ckpts["qwen3"]), "--device", "cpu",
            "--dummy-weights", "--dummy-quantization", "none", "fp8", "--batch-sizes", "1",
            "--steps", "2", "--input-len", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^batch\s+1:", out, re.MULTILINE)) == 2
    assert out.count("block-FP8 config: 0 weights FP8") == 1


def test_dummy_quantization_needs_dummy_weights(tiny_ckpts) -> None:
    argv = ["bench", "latency", "--model", str(tiny_ckpts["qwen3"]), "--device", "cpu",
            "--dummy-quantization", "fp8"]
    with pytest.raises(SystemExit, match="needs --dummy-weights"):
        main(argv)


def _breakdown(out: str) -> dict[str, float]:
    """The `--breakdown` table under the first batch line: label -> ms per step."""
    block = out.split("eager forward by part", 1)[1].split("\nbatch", 1)[0]
    return {m.group(1).strip(): float(m.group(2))
            for m in re.finditer(r"^\s{4}(\S.*?)\s+([\d.]+)(?:\s+[\d.]+%)?$", block, re.MULTILINE)}


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow),
                                    pytest.param("cuda", marks=pytest.mark.gpu)])
def test_breakdown_names_every_part_once_and_adds_up(tiny_ckpts, capsys, device: str) -> None:
    """Every layer part is timed (a MoE layer as one block), each once, so the parts never add up
    to more than the forward and the rest is reported as the time between them. On CUDA the
    parts are events behind a sleep kernel, with the engine's graphs bypassed and restored."""
    for arch, mlp in (("qwen3", ["gate_up_proj", "SiLU-and-mul", "down_proj"]),
                      ("qwen3_moe", ["MoE block (router, top-k, experts)"])):
        argv = ["bench", "latency", "--model", str(tiny_ckpts[arch]), "--device", device,
                "--batch-sizes", "2", "3", "--steps", "3", "--input-len", "8", "--breakdown"]
        assert main(argv) == 0
        out = capsys.readouterr().out
        # timed first: a breakdown's eager, sleep-fronted steps run after every timed figure
        assert out.rindex("ms/step") < out.index("eager forward by part")
        parts = _breakdown(out)
        want = ["embedding", "RMSNorm (with residual add)", "qkv_proj",
                "rotary + KV store (+ q/k norm)", "attention", "o_proj", "final RMSNorm",
                "lm_head", *mlp]
        assert all(parts.get(p, 0) > 0 for p in want), (arch, parts)
        named = sum(ms for p, ms in parts.items() if p not in ("forward", "between the parts"))
        rounding = 0.0005 * (len(parts) + 1)  # the table prints each figure to 3 decimals
        assert named <= parts["forward"] + rounding, (arch, parts)
        assert abs(named + parts["between the parts"] - parts["forward"]) <= rounding, (arch, parts)


def test_breakdown_refuses_tensor_parallel(tiny_ckpts) -> None:
    argv = ["bench", "latency", "--model", str(tiny_ckpts["llama"]), "--device", "cpu",
            "--batch-sizes", "1", "--steps", "1", "--tp", "2", "--breakdown"]
    with pytest.raises(SystemExit, match="--breakdown times one process"):
        main(argv)
