"""What the declarations in `config.py` give: `--help` shows every default, docs/configuration.md
is their table, `LLM(...)` takes exactly the declared settings by name and refuses a bad value in
the flag's words, and each pluggable part's registry serves exactly the declared choices."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from radixserve.cli import DefaultsHelp, build_parser
from radixserve.config import (
    ATTN_CHOICES,
    CACHE_CHOICES,
    CONFIGS,
    KV_CACHE_DTYPE_CHOICES,
    TOOL_CALL_PARSERS,
    EngineConfig,
    SchedulerConfig,
    flags_markdown,
)
from radixserve.llm import llm_config
from radixserve.options import options_of

ROOT = Path(__file__).resolve().parents[2]


def _parsers(parser: argparse.ArgumentParser, prog: str = "radixserve"):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def test_help_shows_every_default() -> None:
    missing = []
    for prog, parser in _parsers(build_parser()):
        fmt = DefaultsHelp(prog)
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._HelpAction):
                continue
            if "default" not in fmt._get_help_string(action):
                missing.append(f"{prog} {'/'.join(action.option_strings)}")
    assert not missing, "no default in --help: " + ", ".join(missing)


def test_serve_help_names_the_declared_defaults() -> None:
    """The defaults the issue found missing, shown as the dataclasses declare them."""
    serve = dict(_parsers(build_parser()))["radixserve serve"]
    for flag, default in [("--host", "127.0.0.1"), ("--port", "8000"), ("--memory-ratio", "0.9"),
                          ("--max-running-requests", "256"), ("--shutdown-timeout", "30.0")]:
        action = serve._option_string_actions[flag]
        assert f"(default: {default})" in DefaultsHelp("serve")._get_help_string(action), flag


def test_configuration_doc_is_generated_from_the_declarations() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert flags_markdown() in doc, "regenerate with: python -m radixserve.config"
    for cls in CONFIGS:
        for f, opt in options_of(cls):
            assert f"`{opt.flag}`" in doc, opt.flag


def test_llm_takes_the_declared_settings_by_name() -> None:
    cfg = llm_config("m", {"page_size": 4, "overlap": False, "chat_template": "{{ x }}"})
    assert (cfg.engine.model, cfg.engine.page_size, cfg.scheduler.overlap) == ("m", 4, False)
    assert cfg.chat_template == "{{ x }}"
    with pytest.raises(TypeError, match=r"unknown options \['pagesize'\].*'page_size'"):
        llm_config(None, {"pagesize": 4})
    with pytest.raises(ValueError, match=r"^page_size must be a power of two, got 3$"):
        llm_config(None, {"page_size": 3})
    with pytest.raises(ValueError, match=r"^tp must be an integer, got '2'$"):
        llm_config(None, {"tp": "2"})
    with pytest.raises(ValueError, match=r"^cache must be one of radix, naive, got 'lru'$"):
        llm_config(None, {"cache": "lru"})


def test_a_flag_left_out_takes_the_declared_default() -> None:
    p = argparse.ArgumentParser()
    from radixserve.config import add_engine_args, configs_from_args

    add_engine_args(p)
    eng, sch = configs_from_args(p.parse_args([]))
    assert (eng, sch) == (EngineConfig(), SchedulerConfig())
    eng, _ = configs_from_args(p.parse_args(["--tp-size", "2"]))
    assert eng.tp == 2


def test_a_list_setting_takes_several_values_on_the_command_line_and_in_llm() -> None:
    """`--lora-paths` (nargs): a tuple from the command line and from `LLM(...)`'s list alike,
    each item checked, and a lone string refused rather than read as a list of characters."""
    from radixserve.config import add_engine_args, configs_from_args, lora_path_pairs

    p = argparse.ArgumentParser()
    add_engine_args(p)
    eng, _ = configs_from_args(p.parse_args(["--lora-paths", "sql=/a/sql", "/b/chat/", "--tp", "1"]))
    assert eng.lora_paths == ("sql=/a/sql", "/b/chat/") and eng.lora
    assert lora_path_pairs(eng.lora_paths) == {"sql": "/a/sql", "chat": "/b/chat/"}
    assert llm_config("m", {"lora_paths": ["sql=/a"]}).engine.lora_paths == ("sql=/a",)
    with pytest.raises(ValueError, match="lora_paths must be a list, got 'sql=/a'"):
        llm_config("m", {"lora_paths": "sql=/a"})
    with pytest.raises(ValueError, match="lora_paths names adapter 'sql' twice"):
        llm_config("m", {"lora_paths": ["sql=/a", "sql=/b"]})
    with pytest.raises(ValueError, match="adapter name ':x' must start"):
        llm_config("m", {"lora_paths": [":x=/a"]})
    with pytest.raises(ValueError, match="lora_paths must be a string"):
        llm_config("m", {"lora_paths": ["a=/x", 3]})
    assert not EngineConfig().lora and EngineConfig(enable_lora=True).lora


def test_each_registry_serves_exactly_the_declared_choices() -> None:
    import importlib

    from radixserve.attention.base import ATTN_BACKENDS
    from radixserve.attention.factory import _MODULES
    from radixserve.kvcache import PREFIX_CACHES
    from radixserve.kvcache.kv_dtype import KV_CACHE_DTYPES
    from radixserve.postprocess.auto_tool_parsers import AUTO_PARSERS

    for module in _MODULES.values():
        importlib.import_module(module)
    assert ATTN_BACKENDS.names() == sorted(ATTN_CHOICES)
    assert PREFIX_CACHES.names() == sorted(CACHE_CHOICES)
    assert tuple(KV_CACHE_DTYPES) == KV_CACHE_DTYPE_CHOICES
    assert set(TOOL_CALL_PARSERS) == {"auto", "none", *AUTO_PARSERS}
