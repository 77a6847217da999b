"""The hostile-request corpus against a live server: no 5xx for any of it, and the server serves
on; the findings it was grown with answer as they should (a 400 naming the field, before work)."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.server.hostile_corpus import CORPUS, RESPONSE, Hostile, deep_schema, mutations
from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
_MUTATIONS = 60


def _send(base: str, h: Hostile) -> httpx.Response:
    return httpx.post(f"{base}{h.path}", content=h.body, headers=AUTH | {"content-type": h.content_type}, timeout=120)


def _serves(base: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{base}/v1/chat/completions", headers=AUTH, json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length"), r.text
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200


def test_hostile_corpus_gets_no_5xx_and_the_server_serves_on(server) -> None:
    failures = []
    for h in CORPUS + mutations(_MUTATIONS):
        r = _send(server.base, h)
        if r.status_code >= 500 or (r.status_code >= 400 and "error" not in r.json()):
            failures.append(f"{h.name}: {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)
    assert "Traceback" not in server.log()
    _serves(server.base)


def _error(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json"), r.text[:200]
    return r.json()["error"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/responses", RESPONSE | {"metadata": {"\ud800": "x"}}, "metadata"),
    ("/v1/responses", RESPONSE | {"metadata": {"k": "\udfff"}}, "metadata.k"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"\udc00": 1}},
     "chat_template_kwargs"),
])
def test_invalid_text_in_any_key_or_value_is_400(server, path: str, body: dict, param: str) -> None:
    # json.dumps escapes a lone surrogate as `\ud800`, as a hostile client sends it
    r = httpx.post(f"{server.base}{path}", headers=AUTH | {"content-type": "application/json"},
                   content=json.dumps(body).encode(), timeout=60)
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == param and "Unicode" in err["message"], err


def test_a_deep_json_schema_is_400_naming_it(server) -> None:
    body = {"text": "hi", "sampling_params": {"max_tokens": 2, "json_schema": deep_schema(3000)}}
    r = httpx.post(f"{server.base}/generate", headers=AUTH, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == "json_schema" and "deeper than" in err["message"], err


def test_a_deeply_nested_body_is_400(server) -> None:
    body = b'{"prompt": "hi", "x": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH | {"content-type": "application/json"},
                   content=body, timeout=60)
    assert r.status_code == 400 and "deeper than" in _error(r)["message"], r.text[:300]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "a" * 100_000, "max_tokens": 2}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "a" * 99_994}], "max_tokens": 2},
     "messages"),  # (the role is text the template writes too)
    ("/tokenize", {"prompt": "a" * 100_000}, "prompt"),
])
def test_a_prompt_past_the_context_is_refused_by_its_characters(server, path: str, body: dict, param: str) -> None:
    """The refusal names characters, not tokens: it was decided before the prompt was tokenized
    (the tokenizer's own count would name tokens)."""
    r = httpx.post(f"{server.base}{path}", headers=AUTH, json=body, timeout=60)
    assert r.status_code == 400, r.text[:300]
    err = _error(r)
    assert err["code"] == "context_length_exceeded" and err["param"] == param, err
    assert "100000 characters long" in err["message"], err


def test_a_prompt_past_the_bound_is_never_sent_to_a_tokenizer() -> None:
    """The frontend refuses it before it sends anything to a tokenizer process."""
    import asyncio

    from radixserve.messages import TextOpMsg, TokenizeMsg
    from radixserve.sampling_params import SamplingParams
    from radixserve.server.errors import APIError
    from radixserve.server.prompt_bound import PromptBound
    from tests.server.recording_frontend import recording_frontend

    frontend = recording_frontend()
    frontend.prompt_bound = PromptBound(max_seq_len=100, max_token_chars=8)
    fits = TokenizeMsg(1, SamplingParams(), "a" * 800)
    too_long = TokenizeMsg(2, SamplingParams(), "a" * 801)
    chat = TokenizeMsg(3, SamplingParams(), chat=[{"role": "user", "content": "a" * 500},
                                                  {"role": "user", "content": "b" * 301}])
    for msgs in ([fits, too_long], [chat]):
        with pytest.raises(APIError) as e:
            asyncio.run(frontend.submit(msgs))
        assert e.value.status == 400 and e.value.code == "context_length_exceeded"
    with pytest.raises(APIError):
        asyncio.run(frontend.text_op(TextOpMsg(4, "tokenize", text="a" * 801)))
    assert frontend.to_tokenizer.sent == [] and not frontend.routes


def test_offline_sampling_params_refuse_a_deep_schema_with_a_value_error() -> None:
    """`LLM` takes the same SamplingParams: a clear ValueError, never a RecursionError."""
    from radixserve.sampling_params import SamplingParams

    with pytest.raises(ValueError, match="json_schema .*deeper than 64"):
        SamplingParams(json_schema=deep_schema(3000))
    assert SamplingParams(json_schema=deep_schema(20)).json_schema is not None
