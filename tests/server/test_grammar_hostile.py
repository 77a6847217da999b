"""Grammars a hostile client sends, against a live server: one that admits no output is a 400
before anything is queued while requests in flight run on; a schema too large for the checks is a
400 naming it; a client that leaves while its grammar compiles stops the compilation, so the
compile workers serve the next grammar at once."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.runtime.test_constrained_bounds import children
from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
NOTHING = r"[^\s\S]"  # a character class no character is in
DEAD_PARAMETERS = {"type": "object", "properties": {"a": {"type": "string", "pattern": NOTHING}},
                   "required": ["a"], "additionalProperties": False}

ADMITS_NOTHING = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 8, "ebnf": "root ::= root"}, "ebnf"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 8, "temperature": 1.0, "ebnf": "root ::= a\na ::= root"},
     "ebnf"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 8, "temperature": 0, "regex": NOTHING}, "regex"),
    ("/v1/chat/completions", CHAT | {"temperature": 1.0, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": NOTHING}}}}, "response_format.json_schema.schema"),
    ("/v1/chat/completions", CHAT | {"tools": [{"type": "function", "function": {"name": "f", "parameters": DEAD_PARAMETERS}}],
                                     "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tools.0.function.parameters"),
    ("/generate", {"text": "hi", "sampling_params": {"max_tokens": 8, "json_schema": json.dumps(DEAD_PARAMETERS)}},
     "json_schema"),
]


def _post(base: str, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{base}{path}", headers=AUTH, json=body, timeout=timeout)


def _stream(base: str, out: list) -> None:
    """A long streamed completion; its events (text) go to `out`."""
    body = {"prompt": "once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", headers=AUTH, json=body, timeout=120) as r:
        out.append(r.status_code)
        out.extend(line for line in r.iter_lines() if line)


def test_a_grammar_that_admits_nothing_is_a_400_and_requests_in_flight_run_on(server) -> None:
    events: list = []
    streaming = threading.Thread(target=_stream, args=(server.base, events))
    streaming.start()
    try:
        for path, body, param in ADMITS_NOTHING:
            for stream in (False, True):
                r = _post(server.base, path, body | {"stream": stream})
                assert r.status_code == 400, (path, r.text[:300])
                err = r.json()["error"]
                assert err["param"] == param and "the grammar admits no output" in err["message"], err
    finally:
        streaming.join(120)
    assert events[0] == 200 and events[-1] == "data: [DONE]", events[-3:]
    last = json.loads(events[-2].removeprefix("data: "))
    assert "error" not in last and last["choices"][0]["finish_reason"] == "length", last
    assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200
    assert _post(server.base, "/v1/chat/completions", CHAT).status_code == 200


def _flat(n: int) -> dict:
    """A schema of n + 2 objects."""
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


NESTED = {"type": "array", "items": {"type": "array", "items": {"type": "object"}}}  # 3 objects


@pytest.mark.parametrize(("body", "param"), [
    (CHAT | {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {f"p{i}": NESTED for i in range(4000)},
        "$defs": {f"d{i}": NESTED for i in range(4000)}}}}}, "response_format.json_schema.schema"),
    # 1,002 objects a tool: the 17th passes the 16,384 the tools share
    (CHAT | {"tools": [{"type": "function", "function": {"name": f"f{t}", "parameters": _flat(1000)}}
                       for t in range(20)]}, "tools.16.function.parameters"),
])
def test_a_schema_past_the_size_limit_is_a_400_naming_it(server, body: dict, param: str) -> None:
    r = _post(server.base, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param and "is too large" in err["message"], err


def test_an_unknown_metaschema_is_never_fetched(server) -> None:
    """`$schema` naming an unknown URL is checked as draft 2020-12 (as `jsonschema` does), and
    nothing is fetched: the server cannot reach that host, the request is answered at once."""
    schema = {"$schema": "http://192.0.2.1/never/fetched", "type": "object",
              "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    r = _post(server.base, "/v1/chat/completions", CHAT | {"max_tokens": 40, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}, timeout=30)
    assert r.status_code == 200, r.text[:300]
    bad = _post(server.base, "/v1/chat/completions", CHAT | {"response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema | {"type": "objec"}}}}, timeout=30)
    assert bad.status_code == 400 and "not a valid JSON schema at /type" in bad.json()["error"]["message"], bad.text


def _optional_properties(n: int, prefix: str) -> dict:
    """A schema whose compilation takes minutes and gigabytes for n in the thousands."""
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "string"} for i in range(n)}}


def test_a_client_that_leaves_stops_its_compilation(server) -> None:
    """Two clients leave while their grammars of minutes compile: both compilations stop (the
    scheduler's trial processes end) and a new grammar is compiled at once, long before the
    compile time limit would have freed the workers."""
    scheduler = server.child_pid("scheduler")
    before = children(scheduler)
    for prefix in ("left_a", "left_b"):
        with pytest.raises(httpx.ReadTimeout):
            _post(server.base, "/v1/chat/completions", CHAT | {"response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": _optional_properties(3000, prefix)}}}, timeout=1.5)
    t0 = time.monotonic()
    fresh = {"type": "object", "properties": {"left_c": {"type": "integer"}}, "required": ["left_c"],
             "additionalProperties": False}
    r = _post(server.base, "/v1/chat/completions", CHAT | {"max_tokens": 30, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": fresh}}}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    assert time.monotonic() - t0 < 15, "the new grammar waited for the abandoned ones"  # the limit is 30 s
    while children(scheduler) - before:
        assert time.monotonic() - t0 < 15, "an abandoned compilation is still running"
        time.sleep(0.1)
