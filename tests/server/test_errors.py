"""Bad requests get the right status and an OpenAI error body; the server keeps serving."""
from __future__ import annotations

import httpx
import pytest

from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _ok_request(base: str) -> None:
    r = httpx.post(f"{base}/v1/chat/completions", headers=AUTH, json=CHAT | {"temperature": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def _max_len(base: str) -> int:
    return httpx.get(f"{base}/v1/models", headers=AUTH).json()["data"][0]["max_model_len"]


CASES = [
    # (name, path, headers, body (dict or raw bytes), status, param, code)
    ("malformed json", "/v1/chat/completions", AUTH, b'{"model": "tiny", "messages": [', 400, None, None),
    ("messages not a list", "/v1/chat/completions", AUTH, {"model": "tiny", "messages": "hi"}, 400, "messages", None),
    ("max_tokens wrong type", "/v1/chat/completions", AUTH, CHAT | {"max_tokens": "lots"}, 400, "max_tokens", None),
    ("negative max_tokens", "/v1/chat/completions", AUTH, CHAT | {"max_tokens": -3}, 400, "max_tokens", None),
    ("temperature out of range", "/v1/completions", AUTH, {"prompt": "x", "temperature": -1}, 400, "temperature", None),
    ("bad role", "/v1/chat/completions", AUTH, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role", None),
    ("image part", "/v1/chat/completions", AUTH, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages.0.content", None),
    ("empty prompt", "/v1/completions", AUTH, {"prompt": "", "max_tokens": 2}, 400, "prompt", None),
    ("empty token prompt", "/generate", AUTH, {"input_ids": []}, 400, "input_ids", None),
    ("unknown model", "/v1/chat/completions", AUTH, CHAT | {"model": "nope"}, 404, "model", "model_not_found"),
    ("wrong api key", "/v1/chat/completions", {"Authorization": "Bearer wrong"}, CHAT, 401, None, "invalid_api_key"),
    ("missing api key", "/v1/completions", {}, {"prompt": "x"}, 401, None, "invalid_api_key"),
    ("n zero", "/v1/completions", AUTH, {"prompt": "x", "n": 0}, 400, "n", None),
    ("top_logprobs over 20", "/v1/chat/completions", AUTH, CHAT | {"logprobs": True, "top_logprobs": 50}, 400, "top_logprobs", None),
    ("form body", "/v1/chat/completions", AUTH | {"content-type": "application/x-www-form-urlencoded"}, b"model=tiny&max_tokens=3", 400, None, None),
    ("json array body", "/v1/completions", AUTH, b'[{"prompt": "x"}]', 400, None, None),
    ("tool message without its call id", "/v1/chat/completions", AUTH, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages.0.tool_call_id", None),
    ("unknown response_format type", "/v1/chat/completions", AUTH, CHAT | {"response_format": {"type": "xml"}}, 400, "response_format.type", None),
    ("regex with ebnf", "/v1/completions", AUTH, {"prompt": "x", "regex": "a", "ebnf": 'root ::= "a"'}, 400, "ebnf", None),
    ("invalid schema", "/v1/completions", AUTH, {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objec"}}}}, 400, "response_format.json_schema.schema", None),
    ("function name with a space", "/v1/chat/completions", AUTH, CHAT | {"tools": [{"type": "function", "function": {"name": "a b"}}]}, 400, "tools.0.function.name", None),
    ("invalid schema in /generate", "/generate", AUTH, {"text": "x", "sampling_params": {"json_schema": '{"type": 5}'}}, 400, "json_schema", None),
    ("logit_bias key not a token id", "/v1/completions", AUTH, {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias", None),
    ("logit_bias token past the vocabulary", "/v1/chat/completions", AUTH, CHAT | {"logit_bias": {"99999": 5}}, 400, "logit_bias", None),
    ("logit_bias over 100", "/v1/completions", AUTH, {"prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias", None),
    ("min_tokens over max_tokens", "/v1/completions", AUTH, {"prompt": "x", "max_tokens": 3, "min_tokens": 4}, 400, "min_tokens", None),
    ("min_tokens with a grammar", "/v1/completions", AUTH, {"prompt": "x", "min_tokens": 2, "regex": "a+"}, 400, "min_tokens", None),
    ("priority not an integer", "/v1/completions", AUTH, {"prompt": "x", "priority": "high"}, 400, "priority", None),
    ("min_tokens over the context left", "/v1/chat/completions", AUTH, {"messages": [{"role": "user", "content": "hi"}], "min_tokens": 10**6}, 400, "min_tokens", None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, case) -> None:
    _, path, headers, body, status, param, code = case
    kw = {"content": body, "headers": {"content-type": "application/json"} | headers} if isinstance(body, bytes) else {"json": body, "headers": headers}
    r = httpx.post(f"{server.base}{path}", timeout=60, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param and err["code"] == code
    _ok_request(server.base)


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_over_the_context_length_is_400_naming_the_limits(server, stream: bool) -> None:
    limit = _max_len(server.base)
    body = {"prompt": [5] * limit, "max_tokens": 8, "stream": stream}
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH, json=body, timeout=60)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"  # completions' name
    assert str(limit) in err["message"] and str(limit + 8) in err["message"]
    _ok_request(server.base)


def test_max_tokens_filling_the_context_exactly_is_accepted(server) -> None:
    limit = _max_len(server.base)
    body = {"prompt": [5] * (limit - 3), "max_tokens": 3, "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH, json=body, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_only_health_needs_no_key(server) -> None:
    assert httpx.get(f"{server.base}/health").status_code == 200
    for path in ("/metrics", "/v1/models", "/openapi.json", "/docs", "/redoc", "/health_generate", "/nowhere"):
        r = httpx.get(f"{server.base}{path}")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
    assert httpx.get(f"{server.base}/metrics", headers=AUTH).status_code == 200


@pytest.mark.parametrize(("body", "content_type"), [(b"model=tiny&max_tokens=3", "application/x-www-form-urlencoded"),
                                                    (b'["x"]', "application/json"), (b"", "application/json")])
def test_a_body_that_is_no_json_object_is_named_so(server, body: bytes, content_type: str) -> None:
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH | {"content-type": content_type}, content=body, timeout=60)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "JSON object" in message and "dictionary" not in message and not message.startswith("body:")


def test_error_names_the_field_the_client_sent(server) -> None:
    body = CHAT | {"logprobs": True, "top_logprobs": 21}
    err = httpx.post(f"{server.base}/v1/chat/completions", headers=AUTH, json=body, timeout=60).json()["error"]
    assert err["param"] == "top_logprobs" and err["message"].startswith("top_logprobs")


def test_engine_field_is_renamed_to_the_clients() -> None:
    from radixserve.server.errors import bad_value

    e = bad_value(ValueError("logprobs must be an integer between 0 and 20"), {"logprobs": "top_logprobs"})
    assert (e.param, e.message) == ("top_logprobs", "top_logprobs must be an integer between 0 and 20")


@pytest.mark.parametrize(("headers", "says"), [({}, "didn't provide an API key"),
                                               ({"Authorization": "Basic abc"}, "must be `Bearer YOUR_KEY`"),
                                               ({"Authorization": "Bearer wrong"}, "Incorrect API key provided")])
def test_401_says_what_is_wrong_with_the_key(server, headers: dict, says: str) -> None:
    r = httpx.post(f"{server.base}/v1/completions", headers=headers, json={"prompt": "x"}, timeout=60)
    assert r.status_code == 401 and says in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
