"""`radixserve bench latency` on CPU: a line per batch size, prompts drawn inside a small model's
vocabulary, and `--profile DIR`: a Chrome trace per batch size and the ops of one step."""
from __future__ import annotations

import json
import re

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
