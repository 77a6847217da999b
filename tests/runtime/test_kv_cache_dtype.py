"""`--kv-cache-dtype` through the engine on CPU: the pool's dtype and scales, the tokens a fixed
memory budget holds (twice bf16's in FP8), the startup log, the flags of every entry point, and
greedy decoding end to end with each cache."""
from __future__ import annotations

import logging

import pytest
import torch

from radixserve import LLM, SamplingParams

FP8 = torch.float8_e4m3fn


def _engine(path, kv: str, **kw):
    from radixserve.config import EngineConfig
    from radixserve.engine.engine import Engine

    return Engine(EngineConfig(model=str(path), dtype="float32", device="cpu", kv_cache_dtype=kv,
                               **kw), max_running_requests=4)


def test_a_fixed_budget_holds_twice_the_bf16_tokens_in_fp8(tiny_ckpts, monkeypatch, caplog) -> None:
    monkeypatch.setenv("RADIXSERVE_CPU_KV_GIB", str(1 / 4096))  # 256 KiB: less than 4 requests want
    tokens = {}
    with caplog.at_level(logging.INFO, logger="radixserve.engine.engine"):
        for kv in ("auto", "bfloat16", "fp8_e4m3"):
            eng = _engine(tiny_ckpts["llama"], kv)
            tokens[kv] = eng.num_pages * eng.page_size
            assert eng.kv_pool.dtype == {"auto": torch.float32, "bfloat16": torch.bfloat16,
                                         "fp8_e4m3": FP8}[kv]
    assert tokens["fp8_e4m3"] == 2 * tokens["bfloat16"] == 4 * tokens["auto"]
    fp8_line = next(r.message for r in caplog.records
                    if "KV sizing" in r.message and "fp8_e4m3" in r.message)
    assert f"{tokens['fp8_e4m3']} tokens (KV cache fp8_e4m3, 128 bytes/token" in fp8_line
    assert "4.0x the tokens of a float32 cache" in fp8_line
    assert any("scales" in r.message and "the default 1.0" in r.message for r in caplog.records)


def test_every_entry_point_takes_the_flag() -> None:
    import argparse

    from radixserve.cli import build_parser
    from radixserve.config import add_engine_args, configs_from_args

    p = argparse.ArgumentParser()
    add_engine_args(p)
    eng, _ = configs_from_args(p.parse_args(["--kv-cache-dtype", "fp8_e4m3"]))
    assert eng.kv_cache_dtype == "fp8_e4m3"
    assert configs_from_args(p.parse_args([]))[0].kv_cache_dtype == "auto"
    parser = build_parser()
    for argv in (["serve"], ["bench", "offline"], ["bench", "latency"], ["generate", "hi"]):
        args = parser.parse_args([*argv, "--kv-cache-dtype", "bfloat16"])
        assert args.kv_cache_dtype == "bfloat16", argv
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--kv-cache-dtype", "int8"])


@pytest.mark.parametrize("kv", ["bfloat16", "fp8_e4m3"])
def test_greedy_with_a_narrower_cache_mostly_matches(tiny_ckpts, kv: str) -> None:
    """LLM(kv_cache_dtype=...) end to end (chunked prefill over a cached prefix, page size 4,
    radix cache): the books balance and the tokens start as the float32 cache's do."""
    from tests.runtime.helpers import random_prompts

    prompts = random_prompts(6, [5, 40, 17], 300, seed=3)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    runs = {}
    for cache in ("auto", kv):
        llm = LLM(str(tiny_ckpts["qwen3"]), dtype="float32", device="cpu", kv_cache_dtype=cache,
                  page_size=4, max_prefill_length=16)
        runs[cache] = [r.token_ids for r in llm.generate(prompts, params)]
        llm.scheduler.check_integrity()
        assert llm.scheduler.engine.kv_pool.dtype != torch.float32 or cache == "auto"
    assert [t[0] for t in runs[kv]] == [t[0] for t in runs["auto"]]
