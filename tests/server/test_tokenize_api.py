"""`/tokenize` and `/detokenize` (vLLM's API, also under /v1): the server's own tokenizer and chat
template, the ids a completion or a chat request would be given, and 400s naming the field."""
from __future__ import annotations

import httpx
import pytest

from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MSGS = [{"role": "user", "content": "Tell me a story about a fox."}]


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", headers=AUTH, json=body, timeout=60)


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_tokenize_counts_what_completions_and_chat_are_given(server, tiny_tokenizer, prefix) -> None:
    text = "Once upon a time, a quick brown fox"
    r = _post(server, f"{prefix}/tokenize", {"model": "tiny", "prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tiny_tokenizer.encode(text) and body["count"] == len(body["tokens"])
    usage = _post(server, "/v1/completions", {"model": "tiny", "prompt": text, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == body["count"]
    bare = _post(server, f"{prefix}/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == tiny_tokenizer.encode(text, add_special_tokens=False)
    chat = _post(server, f"{prefix}/tokenize", {"messages": MSGS}).json()
    templated = tiny_tokenizer.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tiny_tokenizer.encode(templated, add_special_tokens=False)
    usage = _post(server, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == chat["count"]
    assert chat["max_model_len"] == httpx.get(f"{server.base}/v1/models", headers=AUTH).json()["data"][0]["max_model_len"]


def test_detokenize_reads_ids_back_with_special_tokens(server, tiny_tokenizer) -> None:
    ids = tiny_tokenizer.encode("a quick brown fox")
    r = _post(server, "/detokenize", {"tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": tiny_tokenizer.decode(ids)}


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "x", "messages": MSGS}, "prompt"),
    ("/tokenize", {"prompt": "x", "model": "nope"}, "model"),
    ("/detokenize", {"tokens": [10**6]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens.0"),
])
def test_bad_requests_name_the_field(server, path, body, param) -> None:
    r = _post(server, path, body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


PREFILL = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]


def test_continue_final_message_extends_the_assistant_text(server, tiny_tokenizer) -> None:
    body = {"messages": PREFILL, "add_generation_prompt": False, "continue_final_message": True}
    got = _post(server, "/tokenize", body).json()["tokens"]
    text = tiny_tokenizer.apply_chat_template(PREFILL, tokenize=False, add_generation_prompt=False,
                                              continue_final_message=True)
    assert text.endswith("The colour is")  # no end of turn: the reply goes on from here
    assert got == tiny_tokenizer.encode(text, add_special_tokens=False)
    r = _post(server, "/v1/chat/completions", body | {"max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(got)


@pytest.mark.parametrize("body,param", [
    ({"messages": PREFILL, "continue_final_message": True}, "continue_final_message"),
    ({"messages": PREFILL[:1], "add_generation_prompt": False, "continue_final_message": True},
     "continue_final_message"),
    ({"messages": PREFILL[:1], "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
])
def test_bad_template_options_name_the_field(server, body, param) -> None:
    for path in ("/v1/chat/completions", "/tokenize"):
        r = _post(server, path, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
