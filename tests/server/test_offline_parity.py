"""`LLM` and the server answer one request alike: the same token ids and the same text, for stop
strings, stop token ids, `n` and chat (greedy, and seeded sampling for `n`), on the tiny random
llama the server tests use. Then `LLM`'s streaming and asyncio forms against its own `generate`."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from radixserve import LLM, SamplingParams
from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "Hello, world! How are you today?"
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a radix tree?"}]


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(str(tiny_model), device="cpu", max_kv_tokens=4096)  # as the `server` fixture


def _post(server, path: str, body: dict) -> dict:
    r = httpx.post(f"{server.base}{path}", headers=AUTH, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _a_stop_string(text: str) -> str:
    """Two printable characters first seen past the start of `text` (so some text comes first)."""
    for i in range(len(text) // 3, len(text) - 2):
        s = text[i:i + 2]
        if s.isprintable() and s.strip() and "\ufffd" not in s and text.find(s) >= 2:
            return s
    pytest.skip(f"no usable stop string in {text!r}")


def test_stop_strings_same_tokens_and_text(server, llm) -> None:
    full = llm.generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True))[0]
    stop = _a_stop_string(full.text)
    sp = SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop])
    got = llm.generate(PROMPT, sp)[0]
    served = _post(server, "/generate", {"text": PROMPT, "sampling_params": {
        "max_tokens": 24, "ignore_eos": True, "stop": [stop], "temperature": 0}})
    assert got.token_ids == served["output_ids"] and got.text == served["text"]
    assert got.finish_reason == served["finish_reason"] == "stop"
    assert stop not in got.text and full.text.startswith(got.text + stop[:1])
    assert len(got.token_ids) < 24, "stopped at the stop string, not at max_tokens"
    assert got.token_ids == full.token_ids[:len(got.token_ids)]


def test_stop_token_ids_same_tokens_and_text(server, llm) -> None:
    full = llm.generate(PROMPT, SamplingParams(max_tokens=16, ignore_eos=True))[0]
    tok = full.token_ids[5]
    cut = full.token_ids.index(tok) + 1
    got = llm.generate(PROMPT, SamplingParams(max_tokens=16, ignore_eos=True,
                                              stop_token_ids=[tok]))[0]
    served = _post(server, "/generate", {"text": PROMPT, "sampling_params": {
        "max_tokens": 16, "ignore_eos": True, "stop_token_ids": [tok], "temperature": 0}})
    assert got.token_ids == served["output_ids"] == full.token_ids[:cut]
    assert got.text == served["text"] and got.finish_reason == served["finish_reason"] == "stop"


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 7}])
def test_n_choices_same_in_the_same_order(server, llm, sampling: dict) -> None:
    got = llm.generate([PROMPT, "The quick brown"], SamplingParams(max_tokens=8, **sampling), n=3)
    served = _post(server, "/v1/completions", {
        "model": "tiny", "prompt": [PROMPT, "The quick brown"], "n": 3, "max_tokens": 8,
        **sampling})
    choices = sorted(served["choices"], key=lambda c: c["index"])
    assert [r.text for r in got] == [c["text"] for c in choices]
    assert [r.finish_reason for r in got] == [c["finish_reason"] for c in choices]
    assert sum(len(r.token_ids) for r in got) == served["usage"]["completion_tokens"]
    if "seed" in sampling:  # choice j samples with seed + j: the choices differ
        assert len({tuple(r.token_ids) for r in got[:3]}) > 1


def test_chat_same_text_with_stop_and_n(server, llm) -> None:
    full = llm.generate([CHAT], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    stop = _a_stop_string(full.text)
    sp = SamplingParams(max_tokens=20, ignore_eos=True, stop=[stop])
    got = llm.generate([CHAT], sp, n=2)
    served = _post(server, "/v1/chat/completions", {
        "model": "tiny", "messages": CHAT, "max_tokens": 20, "ignore_eos": True, "stop": [stop],
        "n": 2, "temperature": 0})
    choices = sorted(served["choices"], key=lambda c: c["index"])
    assert [r.text for r in got] == [c["message"]["content"] for c in choices]
    assert [r.finish_reason for r in got] == [c["finish_reason"] for c in choices] == ["stop"] * 2
    assert served["usage"]["prompt_tokens"] == len(got[0].prompt_token_ids)
    # a one-message chat is the `chat=True` form of a text prompt
    one = [{"role": "user", "content": "What is a radix tree?"}]
    assert (llm.generate([one], SamplingParams(max_tokens=6))[0].token_ids
            == llm.generate("What is a radix tree?", SamplingParams(max_tokens=6),
                            chat=True)[0].token_ids)


def test_stream_and_async_forms_give_generates_answer(llm) -> None:
    full = llm.generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True))[0]
    sp = SamplingParams(max_tokens=24, ignore_eos=True, stop=[_a_stop_string(full.text)])
    want = llm.generate(PROMPT, sp)[0]
    outs = list(llm.stream(PROMPT, sp))
    assert "".join(o.text for o in outs) == want.text
    assert [t for o in outs for t in o.token_ids] == want.token_ids
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert outs[-1].finish_reason == "stop"

    async def run() -> tuple[list, list]:
        results = await asyncio.gather(*[llm.agenerate(PROMPT, sp) for _ in range(3)])
        deltas = [o async for o in llm.astream(PROMPT, sp)]
        return results, deltas

    results, deltas = asyncio.run(run())
    assert all(r[0].token_ids == want.token_ids and r[0].text == want.text for r in results)
    assert "".join(o.text for o in deltas) == want.text
    llm.scheduler.check_integrity()
