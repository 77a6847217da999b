"""Logs an operator can read: one format for every process (plain, or JSON lines), the process
name in each line, one access line per request with its request id, a line for each rejected
request, the startup phases with their time."""
from __future__ import annotations

import io
import json
import logging
import re
import time

import httpx
import pytest

from radixserve.logs import JsonFormatter, PlainFormatter, _Context, request_id
from tests.server.server_process import API_KEY, ServerProcess

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(_Context("scheduler"))
    handler.setFormatter(formatter)
    log = logging.getLogger(f"radixserve.test.{type(formatter).__name__}")
    log.handlers[:] = [handler]
    log.propagate, log.level = False, logging.INFO
    return log, out


def test_plain_line_names_process_and_request() -> None:
    log, out = _logger(PlainFormatter())
    token = request_id.set("req-7")
    try:
        log.warning("admitted %d", 3, extra={"fields": {"tokens": 12, "why": "a b", "ttft_ms": None}})
    finally:
        request_id.reset(token)
    log.info("idle")
    first, second = out.getvalue().splitlines()
    assert re.fullmatch(r"\S+ WARNING \[scheduler\] radixserve\.test\.PlainFormatter: admitted 3 "
                        r'tokens=12 why="a b" ttft_ms=- request_id=req-7', first), first
    assert second.endswith("INFO [scheduler] radixserve.test.PlainFormatter: idle")


def test_json_line_is_one_object_with_fields_and_exception() -> None:
    log, out = _logger(JsonFormatter())
    token = request_id.set("req-8")
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("failed", extra={"fields": {"status": 500}, "message_fields": {"path": "/x"}})
    finally:
        request_id.reset(token)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, "a traceback stays inside its line"
    rec = json.loads(lines[0])
    assert rec["process"] == "scheduler" and rec["level"] == "ERROR" and rec["message"] == "failed"
    assert rec["status"] == 500 and rec["path"] == "/x" and rec["request_id"] == "req-8"
    assert "RuntimeError: boom" in rec["exception"]


def _wait_for_line(srv: ServerProcess, pattern: str) -> re.Match:
    deadline = time.monotonic() + 30  # the line is written as the response ends; not a timing check
    while time.monotonic() < deadline:
        m = re.search(pattern, srv.log(), re.MULTILINE)
        if m:
            return m
        time.sleep(0.1)
    raise AssertionError(f"no line matching {pattern!r} in:\n{srv.log()[-3000:]}")


@pytest.mark.parametrize("stream", [False, True])
def test_access_line_per_request_with_the_clients_request_id(server, stream: bool) -> None:
    rid = f"trace-{int(stream)}-{time.monotonic_ns()}"
    body = {"prompt": "hello", "max_tokens": 3, "ignore_eos": True, "stream": stream}
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH | {"X-Request-Id": rid}, json=body, timeout=60)
    assert r.status_code == 200 and r.headers["x-request-id"] == rid
    m = _wait_for_line(server, rf"^.* INFO \[server\] radixserve\.access: POST /v1/completions 200 (.*) request_id={rid}$")
    fields = dict(kv.split("=", 1) for kv in m.group(1).split())
    assert int(fields["prompt_tokens"]) > 0 and fields["completion_tokens"] == "3"
    assert float(fields["ttft_ms"]) <= float(fields["duration_ms"])


def test_rejected_request_is_a_warning_line_with_the_error(server) -> None:
    rid = f"bad-{time.monotonic_ns()}"
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH | {"X-Request-Id": rid},
                   json={"prompt": "x", "temperature": -1}, timeout=60)
    assert r.status_code == 400 and r.headers["x-request-id"] == rid
    line = _wait_for_line(server, rf"^.*radixserve\.access: POST /v1/completions 400 rejected .*request_id={rid}$").group(0)
    assert " WARNING [server] " in line and "param=temperature" in line and 'error="temperature:' in line


def test_unauthorised_request_is_logged_and_gets_an_id(server) -> None:
    r = httpx.post(f"{server.base}/v1/completions", json={"prompt": "x"}, timeout=60)
    assert r.status_code == 401
    rid = r.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid), "no id given: the server makes one"
    _wait_for_line(server, rf"^.*WARNING \[server\] radixserve\.access: POST /v1/completions 401 rejected .*request_id={rid}$")


@pytest.mark.parametrize("given", ["has space", "x" * 129, 'quo"te', "per%0Acent", ""])
def test_unsafe_request_id_is_replaced(server, given: str) -> None:
    r = httpx.get(f"{server.base}/health", headers={"X-Request-Id": given})
    assert r.status_code == 200 and r.headers["x-request-id"] != given
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])


def test_json_log_format_for_every_process(tiny_model, tmp_path) -> None:
    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--log-format", "json", "--max-kv-tokens", "4096")
    try:
        srv.wait_ready()
        r = httpx.post(f"{srv.base}/v1/completions", headers={"X-Request-Id": "json-1"},
                       json={"prompt": "hi", "max_tokens": 2, "ignore_eos": True}, timeout=60)
        assert r.status_code == 200
        _wait_for_line(srv, r'"request_id": "json-1"')
    finally:
        assert srv.stop() == 0
    records = [json.loads(line) for line in srv.log().splitlines() if line.strip()]  # every line is JSON
    assert {"server", "scheduler", "detokenizer"} <= {rec["process"] for rec in records}
    access = [rec for rec in records if rec.get("request_id") == "json-1" and rec["logger"] == "radixserve.access"]
    assert len(access) == 1
    a = access[0]
    assert (a["method"], a["path"], a["status"], a["completion_tokens"]) == ("POST", "/v1/completions", 200, 2)
    assert a["prompt_tokens"] > 0 and a["ttft_ms"] is not None and a["duration_ms"] >= a["ttft_ms"]
    phases = [rec["message"] for rec in records if rec["process"] == "scheduler"]
    assert any(re.match(r"load: .* in \d+\.\ds$", m) for m in phases), phases
    assert any(re.match(r"KV sizing: \d+ tokens .* in \d+\.\ds$", m) for m in phases), phases
    assert any(re.match(r"startup: every process ready in \d+\.\ds$", rec["message"]) for rec in records)
