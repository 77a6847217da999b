"""The model is resolved (its directory found, converted or downloaded) and its config read once
per process start, then passed down: the engine, the weight loader, the EOS ids and the grammar
compiler all take what the process resolved."""
from __future__ import annotations

import sys
from collections import Counter

import pytest
import transformers

from radixserve.models import default_model


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts of `resolve_model_path` (under every name it was imported as) and of
    `AutoConfig.from_pretrained`."""
    seen: Counter = Counter()
    resolve = default_model.resolve_model_path

    def counted_resolve(*a, **kw):
        seen["resolve_model_path"] += 1
        return resolve(*a, **kw)

    for module in list(sys.modules.values()):
        if getattr(module, "resolve_model_path", None) is resolve:
            monkeypatch.setattr(module, "resolve_model_path", counted_resolve)
    from_pretrained = transformers.AutoConfig.from_pretrained

    def counted_config(*a, **kw):
        seen["AutoConfig.from_pretrained"] += 1
        return from_pretrained(*a, **kw)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", counted_config)
    return seen


def test_an_engine_start_resolves_the_model_once(tiny_ckpts, calls: Counter) -> None:
    from radixserve import LLM, SamplingParams

    llm = LLM(str(tiny_ckpts["qwen3"]), device="cpu", dtype="float32", max_kv_tokens=256)
    try:
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True))
        assert len(out[0].token_ids) == 2
    finally:
        llm.close()
    assert calls == {"resolve_model_path": 1, "AutoConfig.from_pretrained": 1}


def test_the_command_line_checks_resolve_the_model_once_and_load_no_config(
        tiny_ckpts, calls: Counter) -> None:
    from radixserve.cli.preflight import check_setup
    from radixserve.config import EngineConfig

    path = check_setup(EngineConfig(model=str(tiny_ckpts["llama"]), device="cpu"))
    assert path == tiny_ckpts["llama"]
    assert calls == {"resolve_model_path": 1}
