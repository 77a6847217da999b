"""Process supervision: a dead scheduler makes the server unhealthy and exit non-zero; SIGTERM lets
an in-flight stream finish, then exits 0 and removes the private socket directory."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.server_process import ServerProcess


def _ipc_dir(srv: ServerProcess) -> Path:
    m = re.search(r"ipc sockets in (\S+)", srv.log())
    assert m, "the server logs its socket directory"
    return Path(m.group(1))


@pytest.fixture
def fresh_server(tiny_model, tmp_path):
    srv = ServerProcess(tiny_model, tmp_path / "server.log")
    srv.wait_ready()
    yield srv
    srv.stop()


def test_killed_scheduler_fails_health_and_exits_nonzero(fresh_server) -> None:
    srv = fresh_server
    ipc = _ipc_dir(srv)
    assert ipc.is_dir()
    os.kill(srv.child_pid("scheduler"), signal.SIGKILL)
    t0, saw_failure = time.monotonic(), False
    while time.monotonic() - t0 < 10 and not saw_failure:
        try:
            saw_failure = httpx.get(f"{srv.base}/health", timeout=1).status_code == 503
        except httpx.HTTPError:
            saw_failure = True  # already gone
        time.sleep(0.1)
    assert saw_failure
    code = srv.proc.wait(timeout=10)  # a liveness bound: it once lingered 20 s and more
    assert code != 0
    assert re.search(r"child process scheduler \(pid \d+\) died with exit code -9", srv.log())
    assert not ipc.exists()


def test_sigterm_drains_in_flight_stream_then_exits_zero(fresh_server) -> None:
    srv = fresh_server
    ipc = _ipc_dir(srv)
    body = {"prompt": "a b c", "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    first_chunk, result = threading.Event(), {}

    def stream() -> None:
        with httpx.stream("POST", f"{srv.base}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                first_chunk.set()
                if line.startswith("data: {") and '"usage": {' in line:
                    result["usage"] = json.loads(line[6:])["usage"]
                if line == "data: [DONE]":
                    result["done"] = True

    t = threading.Thread(target=stream)
    t.start()
    assert first_chunk.wait(30)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert result.get("done") and result["usage"]["completion_tokens"] == 200
    assert srv.proc.wait(timeout=30) == 0
    assert not ipc.exists()


def _stream_events(srv: ServerProcess, first_chunk: threading.Event, events: list) -> None:
    body = {"prompt": "a b c", "max_tokens": 1000, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{srv.base}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                first_chunk.set()


def _assert_ends_with_error_then_done(events: list, status_type: str) -> None:
    assert events[-1] == "[DONE]", events[-3:]
    err = json.loads(events[-2])["error"]
    assert err["type"] == status_type and err["message"], err
    assert sum(e == "[DONE]" for e in events) == 1


def test_stream_cut_by_scheduler_death_ends_with_error_and_done(fresh_server) -> None:
    srv, first_chunk, events = fresh_server, threading.Event(), []
    t = threading.Thread(target=_stream_events, args=(srv, first_chunk, events))
    t.start()
    assert first_chunk.wait(30)
    os.kill(srv.child_pid("scheduler"), signal.SIGKILL)
    t.join(30)
    assert not t.is_alive()
    _assert_ends_with_error_then_done(events, "service_unavailable")
    assert srv.proc.wait(timeout=20) != 0
    assert "Exception in ASGI application" not in srv.log()


def test_stream_cut_by_the_drain_deadline_ends_with_error_and_done(tiny_model, tmp_path) -> None:
    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--shutdown-timeout", "1")
    srv.wait_ready()
    try:
        first_chunk, events = threading.Event(), []
        t = threading.Thread(target=_stream_events, args=(srv, first_chunk, events))
        t.start()
        assert first_chunk.wait(30)
        srv.proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert not t.is_alive()
        _assert_ends_with_error_then_done(events, "service_unavailable")
        assert "drain deadline" in json.loads(events[-2])["error"]["message"]
        assert srv.proc.wait(timeout=30) == 0
        # its access line counts the tokens streamed before the cut: one chunk each
        m = re.search(r"radixserve\.access: POST /v1/completions 200 prompt_tokens=(\d+) completion_tokens=(\d+)",
                      srv.log())
        assert m and int(m.group(1)) > 0 and int(m.group(2)) == len(events) - 2, srv.log()[-2000:]
        assert "Exception in ASGI application" not in srv.log()
    finally:
        srv.stop()


def test_health_answers_503_loading_at_once_while_starting(tiny_model, tmp_path) -> None:
    """From the moment the port is bound until the server is ready, /health answers 503 "loading"
    (it used to hold the connection unanswered); once serving, connections past
    --max-connections get 503; the idle server stops on SIGTERM with 0, saying so."""
    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--max-connections", "4")
    try:
        loading, deadline = 0, time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{srv.base}/health", timeout=5)
            except httpx.ConnectError:  # not bound yet
                assert srv.proc.poll() is None, srv.log()[-3000:]
                time.sleep(0.05)
                continue
            if r.status_code == 200:
                break
            assert r.status_code == 503 and r.json()["error"]["code"] == "loading", r.text
            loading += 1
            time.sleep(0.05)
        assert loading > 0
        held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(4)]
        assert httpx.get(f"{srv.base}/health", timeout=10).status_code == 503
        for s in held:
            s.close()
        time.sleep(0.5)
        assert httpx.get(f"{srv.base}/health", timeout=10).status_code == 200
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=10) == 0  # a liveness bound: it once took 13 s
        assert "shutting down (SIGTERM)" in srv.log()
    finally:
        srv.stop()


def test_sigint_says_what_the_drain_waits_for(tiny_model, tmp_path) -> None:
    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--shutdown-timeout", "5")
    srv.wait_ready()
    try:
        first_chunk, events = threading.Event(), []
        t = threading.Thread(target=_stream_events, args=(srv, first_chunk, events))
        t.start()
        assert first_chunk.wait(30)
        srv.proc.send_signal(signal.SIGINT)
        t.join(60)
        assert srv.proc.wait(timeout=60) == 0
        log = srv.log()
        assert "shutting down (SIGINT)" in log
        assert re.search(r"waiting for 1 request\(s\) in flight to finish: POST /v1/completions", log), log[-3000:]
        assert events[-1] == "[DONE]"
    finally:
        srv.stop()
