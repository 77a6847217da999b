"""Requests too large in any part are refused cheaply, and none holds the event loop: `/health`
answers promptly while they are read and refused, and every field the chat template is given counts
toward the prompt's bound (refused by characters, messages or token ids, before tokenizing)."""
from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
HEALTH_BOUND_S = 5.0  # the heartbeat limit: a loop held this long fails its liveness probe


class HealthSeen:
    """What `health_probe` saw: the slowest answer and every status."""

    def __init__(self) -> None:
        self.slowest, self.statuses = 0.0, set()


@contextlib.contextmanager
def health_probe(base: str) -> Iterator[HealthSeen]:
    """`/health` polled from a thread while the block runs."""
    seen, stop = HealthSeen(), threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                t = time.monotonic()
                try:
                    seen.statuses.add(c.get(f"{base}/health").status_code)
                except httpx.HTTPError as e:
                    seen.statuses.add(type(e).__name__)
                seen.slowest = max(seen.slowest, time.monotonic() - t)
                time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(90)


def _tools(count: int, params: int) -> list[dict]:
    return [{"type": "function", "function": {"name": f"f{t}", "description": "a tool", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "string", "description": "a parameter"}
                                         for j in range(params)}}}} for t in range(count)]


HUGE = {
    "a million unknown keys": ("/v1/completions", lambda: {"prompt": "hi", "max_tokens": 2,
                                                           **{f"k{i}": 1 for i in range(10**6)}}),
    "300,000 empty messages": ("/v1/chat/completions",
                               lambda: {"messages": [{"role": "user", "content": ""}] * 300_000, "max_tokens": 2}),
    "ten million token ids": ("/v1/completions", lambda: {"prompt": [5] * 10_000_000, "max_tokens": 2}),
    "two million prompt strings": ("/v1/completions", lambda: {"prompt": ["a"] * 2_000_000, "max_tokens": 2}),
    "128 tools of 80 parameters": ("/v1/chat/completions", lambda: {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": _tools(128, 80)}),
    "a schema of 200,000 nodes": ("/v1/chat/completions", lambda: {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                f"p{i}": {"type": "object", "properties": {f"q{j}": {"type": "integer"} for j in range(50)}}
                for i in range(4000)}}}}}),
}


@pytest.mark.parametrize("name", list(HUGE))
def test_a_huge_request_is_refused_while_health_answers(server, name: str) -> None:
    path, body = HUGE[name]
    raw = json.dumps(body()).encode()
    with health_probe(server.base) as probe:
        time.sleep(0.2)
        r = httpx.post(f"{server.base}{path}", content=raw, headers=AUTH, timeout=300)
        time.sleep(0.3)
    assert 400 <= r.status_code < 500 and "error" in r.json(), r.text[:300]
    assert probe.statuses == {200}, probe.statuses
    assert probe.slowest < HEALTH_BOUND_S, f"/health took {probe.slowest:.1f}s"


def _refusal(server, path: str, body: dict) -> dict:
    r = httpx.post(f"{server.base}{path}", content=json.dumps(body).encode(), headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text[:300]
    return r.json()["error"]


LONG = "word " * 4000  # 20,000 characters: past the tiny model's 1,024 tokens × 13 characters
USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(("field", "body"), [
    ("name", {"messages": [USER | {"name": LONG}]}),
    ("reasoning_content", {"messages": [USER, {"role": "assistant", "content": "ok", "reasoning_content": LONG}]}),
    ("tool call arguments", {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"a": LONG})}}]}]}),
    ("tool_call_id", {"messages": [USER, {"role": "tool", "tool_call_id": LONG, "content": "x"}]}),
    ("tools", {"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "description": LONG}}]}),
    ("chat_template_kwargs", {"messages": [USER], "chat_template_kwargs": {"note": LONG}}),
])
def test_every_field_the_template_is_given_counts_toward_the_bound(server, field: str, body: dict) -> None:
    """Refused by its characters, so before any tokenizing (a tokenizer's refusal counts tokens),
    also where this model's template leaves the field out (it would be served otherwise)."""
    err = _refusal(server, "/v1/chat/completions", body | {"max_tokens": 2})
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
    assert "characters long" in err["message"], err


def test_more_messages_than_the_context_has_tokens_are_refused_before_tokenizing(server) -> None:
    err = _refusal(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": ""}] * 2000,
                                                    "max_tokens": 2})
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
    assert "the conversation has 2000 messages" in err["message"], err
    err = _refusal(server, "/tokenize", {"messages": [{"role": "user", "content": ""}] * 2000})
    assert "the conversation has 2000 messages" in err["message"], err


def test_token_ids_past_the_context_are_refused_unless_truncated(server) -> None:
    context = httpx.get(f"{server.base}/v1/models", headers=AUTH, timeout=10).json()["data"][0]["max_model_len"]
    ids = [5] * (context + 500)
    err = _refusal(server, "/v1/completions", {"prompt": ids, "max_tokens": 2})
    assert err["code"] == "context_length_exceeded" and f"the prompt has {context + 500} tokens" in err["message"], err
    err = _refusal(server, "/generate", {"input_ids": ids, "sampling_params": {"max_tokens": 2}})
    assert f"the prompt has {context + 500} tokens" in err["message"], err
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH, timeout=60,
                   content=json.dumps({"prompt": ids, "max_tokens": 2, "truncate_prompt_tokens": 8}).encode())
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 8, r.text[:300]
