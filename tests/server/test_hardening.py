"""Replays of a load-and-fuzz run: every request of a kind that can crash a scheduler, leak a 500
or outlive its client gets a 4xx (or a correct 200) and the server keeps serving."""
from __future__ import annotations

import http.client
import json
import time

import httpx
import pytest

from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BIG = 2**64


def _post(base: str, path: str, body: dict | bytes, headers: dict | None = None) -> httpx.Response:
    # json.dumps escapes lone surrogates as \\udXXX, as a hostile client would send them
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json"} | (AUTH if headers is None else headers)
    return httpx.post(f"{base}{path}", content=raw, headers=hdrs, timeout=60)


def _still_serving(base: str) -> None:
    r = _post(base, "/v1/chat/completions", CHAT | {"temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert httpx.get(f"{base}/health").status_code == 200


NUMERIC = [  # finding 1: sampling must be numerically safe for every accepted value
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": 1e-37}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": 5e-324, "top_p": 0.5}),
    ("/v1/chat/completions", CHAT | {"temperature": 1, "repetition_penalty": 1e-40}),
    ("/v1/chat/completions", CHAT | {"temperature": 100, "repetition_penalty": 5e-324, "min_p": 1.0}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": 1e-30, "frequency_penalty": -2,
                         "presence_penalty": -2, "logprobs": 20}),
    ("/generate", {"text": "hi", "sampling_params": {"max_tokens": 4, "temperature": 1e-37, "repetition_penalty": 1e-40}}),
]


@pytest.mark.parametrize("path,body", NUMERIC)
def test_extreme_sampling_values_are_served(server, path: str, body: dict) -> None:
    r = _post(server.base, path, body)
    assert r.status_code == 200, r.text
    _still_serving(server.base)


def _sp(**kw) -> dict:
    return {"text": "hi", "sampling_params": {"max_tokens": 2} | kw}


REJECTED = [
    # finding 2: /generate's sampling_params are typed
    ("stop_token_ids string", "/generate", _sp(stop_token_ids="abc"), "sampling_params.stop_token_ids"),
    ("stop_token_ids null", "/generate", _sp(stop_token_ids=None), "sampling_params.stop_token_ids"),
    ("logprobs float", "/generate", _sp(logprobs=1.5), "sampling_params.logprobs"),
    ("unknown sampling field", "/generate", _sp(bogus=1), "sampling_params.bogus"),
    # finding 3: integers are bounded before they reach msgpack or the engine
    ("huge max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": BIG}, "max_tokens"),
    ("huge seed", "/v1/completions", {"prompt": "hi", "seed": BIG}, "seed"),
    ("huge top_k", "/v1/chat/completions", CHAT | {"top_k": BIG}, "top_k"),
    ("huge stop token", "/v1/chat/completions", CHAT | {"stop_token_ids": [BIG]}, "stop_token_ids.0"),
    ("huge token prompt", "/v1/completions", {"prompt": [1, BIG]}, "prompt.1"),
    ("huge nested token prompt", "/v1/completions", {"prompt": [[1], [BIG]]}, "prompt.1.0"),
    ("huge input_ids", "/generate", {"input_ids": [BIG]}, "input_ids.0"),
    ("negative input_ids", "/generate", {"input_ids": [-1]}, "input_ids.0"),
    # finding 4: text must be valid Unicode
    ("surrogate prompt", "/v1/completions", {"prompt": "a\ud800b"}, "prompt"),
    ("surrogate chat", "/v1/chat/completions", CHAT | {"messages": [{"role": "user", "content": "a\udfffb"}]}, "messages.0.content"),
    ("surrogate part", "/v1/chat/completions", CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}, "messages.0.content.0.text"),
    ("surrogate stop", "/v1/chat/completions", CHAT | {"stop": ["ok", "\ud800"]}, "stop.1"),
    ("surrogate generate", "/generate", {"text": "x\ud800"}, "text"),
    # finding 10: strict types
    ("max_tokens string", "/v1/completions", {"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ("stream string", "/v1/chat/completions", CHAT | {"stream": "yes"}, "stream"),
    ("temperature string", "/v1/chat/completions", CHAT | {"temperature": "0"}, "temperature"),
    ("NaN temperature", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', "temperature"),
    ("n float", "/v1/completions", {"prompt": "hi", "n": 2.0}, "n"),
]


@pytest.mark.parametrize("case", REJECTED, ids=[c[0] for c in REJECTED])
def test_invalid_fields_are_400_naming_the_field(server, case) -> None:
    _, path, body, param = case
    r = _post(server.base, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    _still_serving(server.base)


def test_a_request_is_accepted_whole_or_not_at_all(server) -> None:
    """Finding 5: the second choice's seed (seed + 1) overflows; nothing at all may be queued."""
    time.sleep(0.6)  # let the scheduler's stats catch up with earlier tests
    before = server.metrics()
    body = {"prompt": "hi", "n": 2, "seed": 2**64 - 1, "max_tokens": 900, "ignore_eos": True}
    assert _post(server.base, "/v1/completions", body).status_code == 400
    time.sleep(0.6)
    after = server.metrics()
    assert after["radixserve_prefill_tokens_total"] == before["radixserve_prefill_tokens_total"]
    assert after["radixserve_running"] == 0 and after["radixserve_waiting"] == 0
    body = {"prompt": "hi", "n": 2, "seed": 2**62, "max_tokens": 1}
    assert _post(server.base, "/v1/completions", body).status_code == 200  # the bound itself is fine
    _still_serving(server.base)


def test_submit_sends_nothing_unless_every_sub_request_encodes() -> None:
    """Finding 5, one layer down: the frontend encodes every sub-request before sending any."""
    import asyncio

    from radixserve.messages import TokenizeMsg
    from radixserve.sampling_params import SamplingParams
    from radixserve.server.errors import APIError
    from tests.server.recording_frontend import recording_frontend

    frontend = recording_frontend()
    ok = TokenizeMsg(1, SamplingParams(seed=2**63 - 1), "hi")
    bad = TokenizeMsg(2, SamplingParams(seed=2**63 - 1), "hi")
    bad.params.seed = 2**64  # as `seed + j` once produced
    with pytest.raises(APIError) as e:
        asyncio.run(frontend.submit([ok, bad]))
    assert e.value.status == 400 and frontend.to_tokenizer.sent == [] and not frontend.routes


def _raw(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn.request(method, path, body=body, headers={"content-type": "application/json"} | (headers or {}))
    r = conn.getresponse()
    data = r.read()
    assert not r.will_close, f"{method} {path} {r.status}: the server closes the connection"
    return r.status, dict(r.getheaders()), data


def test_rejections_keep_the_connection_usable(server) -> None:
    """Finding 6: one keep-alive connection survives every kind of rejection."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.connect()
    sock = conn.sock
    auth = AUTH
    assert _raw(conn, "POST", "/v1/completions", b'{"prompt": [', auth)[0] == 400
    assert _raw(conn, "POST", "/v1/completions", b'{"prompt": "x"}', {"Authorization": "Bearer no"})[0] == 401
    assert _raw(conn, "POST", "/v1/completions", json.dumps({"prompt": "a\ud800"}).encode(), auth)[0] == 400
    assert _raw(conn, "POST", "/v1/chat/completions", json.dumps(CHAT | {"model": "x"}).encode(), auth)[0] == 404
    assert _raw(conn, "GET", "/v1/completions", None, auth)[0] == 405
    status, _, data = _raw(conn, "POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}).encode(), auth)
    assert status == 200 and json.loads(data)["choices"]
    assert conn.sock is sock, "every request went over the first connection"
    conn.close()


def test_a_500_keeps_the_connection_usable() -> None:
    """Finding 6: an unexpected exception in a handler becomes a 500 error body, not a reset."""
    import threading

    import uvicorn
    from fastapi import FastAPI

    from radixserve.server.middleware import CatchAllMiddleware
    from tests.server.server_process import free_port

    app = FastAPI()
    app.add_middleware(CatchAllMiddleware)

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("a bug")

    @app.get("/ok")
    async def ok() -> dict:
        return {"ok": True}

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(200):
            try:
                conn.connect()
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
        sock = conn.sock
        status, _, data = _raw(conn, "GET", "/boom")
        assert status == 500 and json.loads(data)["error"]["type"] == "server_error"
        assert _raw(conn, "GET", "/ok")[0] == 200 and conn.sock is sock
        conn.close()
    finally:
        srv.should_exit = True
        t.join(10)


def test_405_says_what_is_allowed(server) -> None:
    r = httpx.get(f"{server.base}/v1/chat/completions", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.delete(f"{server.base}/health")
    assert r.status_code == 405 and "GET" in r.headers["allow"]


def test_openapi_documents_what_is_sent(server) -> None:
    """Finding 10: 400 (not 422) with the error body; /metrics is text; POSTs may stream."""
    spec = httpx.get(f"{server.base}/openapi.json", headers=AUTH).json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (method, path)
            if path != "/health":
                assert "401" in op["responses"] and op["security"] == [{"bearer": []}]
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert chat["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    r = httpx.get(f"{server.base}/metrics", headers=AUTH)
    assert r.headers["content-type"].startswith("text/plain")


def test_key_is_checked_before_the_body_is_parsed(server) -> None:
    """Finding 11: a keyless caller learns nothing about the body's validity."""
    for body in (b'{"messages": [', b"\xff\xfe", b'{"messages": "x"}'):
        r = _post(server.base, "/v1/chat/completions", body, headers={})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_unknown_model_name_is_not_echoed_whole(server) -> None:
    name = "m" * 2_000_000
    r = _post(server.base, "/v1/chat/completions", CHAT | {"model": name})
    assert r.status_code == 404 and len(r.text) < 500
    assert r.json()["error"]["code"] == "model_not_found"


def test_models_show_no_filesystem_path(server, tiny_model) -> None:
    r = httpx.get(f"{server.base}/v1/models", headers=AUTH)
    assert r.status_code == 200 and str(tiny_model) not in r.text and "/" not in json.dumps(r.json()["data"])


def test_sampler_is_numerically_safe_for_every_accepted_value() -> None:
    """Finding 1 at the source: extremes of every accepted field never reach multinomial as nan."""
    import itertools
    import random

    import torch

    from radixserve.core.request import Req
    from radixserve.engine.sampler import Sampler
    from radixserve.sampling_params import SamplingParams

    grid = {"temperature": [1e-37, 5e-324, 1.0, 100.0], "top_p": [5e-324, 0.5, 1.0], "top_k": [-1, 2, 2**31 - 1],
            "min_p": [0.0, 1.0], "frequency_penalty": [-2.0, 2.0], "repetition_penalty": [5e-324, 1e-40, 2.0],
            "logprobs": [None, 20]}
    sampler, rng = Sampler(torch.device("cpu")), random.Random(19)
    for values in itertools.product(*grid.values()):
        req = Req(1, [1, 2, 3], SamplingParams(max_tokens=4, **dict(zip(grid, values))))
        req.output_ids = [3, 3, 4]
        logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(rng.randrange(1000))) * rng.choice([3.0, 1e30])
        token = int(sampler.sample(logits, [req]).tokens[0])
        assert 0 <= token < 64, values
