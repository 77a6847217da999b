"""A mistake in the command line is answered in about the time `--help` takes: the checks against
the model's config read config.json as JSON, so neither torch nor transformers is imported before
the one-line answer. The JSON reading must agree with transformers' own config on every field the
checks use."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers")
SHAPE_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings")

# The CLI run in a fresh interpreter; it prints which heavy modules the run imported, then whether
# transformers' records still reach the root logger once it is imported afterwards.
_PROBE = """
import json, logging, sys
from radixserve.cli import main
rc = main(sys.argv[1:])
loaded = [m for m in {heavy!r} if m in sys.modules]
from transformers.utils import logging as hf_logging
hf_logging.get_logger("transformers.probe")
lib = logging.getLogger("transformers")
print(json.dumps({{"rc": rc, "loaded": loaded, "propagates": lib.propagate,
                  "own_handlers": len(lib.handlers)}}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_dir(tmp_path: Path, **config: object) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 512}
    (d / "config.json").write_text(json.dumps(base | config))
    (d / "model.safetensors").write_bytes(b"")  # present: the weights are not what is checked
    return d


def _probe(*argv: str) -> tuple[dict, str]:
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    # NOTE: the timeout only guards against a hang; nothing here is timed
    r = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *argv], check=False,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.mark.parametrize(("flags", "words"), [
    (("--tp", "3"), ("--tp 3", "4 attention heads")),
    (("--context-length", "4096"), ("--context-length 4096", "512")),
])
def test_config_mistakes_are_answered_without_torch_or_transformers(tmp_path, flags, words) -> None:
    out, err = _probe("serve", "--model", str(_model_dir(tmp_path)), "--port", str(_free_port()),
                      *flags)
    assert out["rc"] == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), err
    assert out["loaded"] == [], f"imported before answering: {out['loaded']}"
    # transformers, imported later, still logs through radixserve's handler, not its own
    assert out["propagates"] and out["own_handlers"] == 0, out


def test_a_multimodal_config_is_checked_against_its_text_config(tmp_path) -> None:
    """Gemma 3 / Mistral 3 ...ForConditionalGeneration keep the language model's fields in
    `text_config`: `--tp 3` against its 4 heads is answered without torch."""
    d = tmp_path / "model"
    d.mkdir()
    text = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2,
            "vocab_size": 256, "max_position_embeddings": 512}
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
        "text_config": text, "vision_config": {"model_type": "pixtral", "hidden_size": 1024}}))
    (d / "model.safetensors").write_bytes(b"")
    out, err = _probe("serve", "--model", str(d), "--port", str(_free_port()), "--tp", "3")
    assert out["rc"] == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--tp 3" in lines[0] and "4 attention heads" in lines[0], err
    assert out["loaded"] == [], f"imported before answering: {out['loaded']}"


@pytest.mark.parametrize("arch", ["gemma3_vision", "mistral3"])
def test_a_multimodal_config_reads_as_transformers_text_config(tmp_path, arch) -> None:
    from transformers import AutoConfig

    from radixserve.cli.preflight import _model_shape
    from radixserve.testing import write_tiny_multimodal_checkpoint

    d = write_tiny_multimodal_checkpoint(arch, tmp_path / arch)
    shape, want = _model_shape(str(d)), AutoConfig.from_pretrained(d)
    for field in SHAPE_FIELDS:
        assert getattr(shape, field) == getattr(want.text_config, field), field
    assert shape.architectures == want.architectures


def test_config_without_kv_heads_reads_as_transformers_does(tmp_path) -> None:
    from transformers import AutoConfig

    from radixserve.cli.preflight import _model_shape

    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_attention_heads": 4, "intermediate_size": 128, "num_hidden_layers": 2,
        "vocab_size": 256, "max_position_embeddings": 512}))
    shape, want = _model_shape(str(d)), AutoConfig.from_pretrained(d)
    for field in SHAPE_FIELDS:
        assert getattr(shape, field) == getattr(want, field), field


def test_tiny_checkpoints_read_as_transformers_does(tiny_ckpts) -> None:
    from transformers import AutoConfig

    from radixserve.cli.preflight import _model_shape

    for arch, path in tiny_ckpts.items():
        shape, want = _model_shape(str(path)), AutoConfig.from_pretrained(path)
        for field in SHAPE_FIELDS + ("architectures",):
            assert getattr(shape, field) == getattr(want, field), (arch, field)
        if hasattr(want, "moe_intermediate_size"):
            assert shape.moe_intermediate_size == want.moe_intermediate_size, arch


def test_config_that_is_not_json_is_one_clear_line(tmp_path) -> None:
    from radixserve.cli.preflight import UsageError, _model_shape

    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"^--model .*model: "):
        _model_shape(str(d))

