"""The official `openai` client against a real server (tiny random llama, real processes)."""
from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.server_process import API_KEY

MSGS = [{"role": "user", "content": "Tell me a story about a fox."}]
PROMPT = "Once upon a time, a quick brown fox"
EXACT = {"ignore_eos": True}  # the random model must not end early: lengths become exact


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def _chat(client, **kw):
    return client.chat.completions.create(model="tiny", messages=MSGS, **kw)


def test_models_lists_the_served_name(client) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_chat_greedy_stream_equals_non_stream_and_usage_matches_tokenizer(client, tiny_tokenizer) -> None:
    full = _chat(client, max_tokens=20, temperature=0, extra_body=EXACT)
    chunks = list(_chat(client, max_tokens=20, temperature=0, stream=True,
                        stream_options={"include_usage": True}, extra_body=EXACT))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    assert full.choices[0].finish_reason == "length"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    templated = tiny_tokenizer.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    n_prompt = len(tiny_tokenizer.encode(templated, add_special_tokens=False))
    assert full.usage.prompt_tokens == n_prompt and full.usage.completion_tokens == 20
    assert full.usage.total_tokens == n_prompt + 20
    last = chunks[-1].usage
    assert chunks[-1].choices == [] and last.model_dump(exclude={"prompt_tokens_details"}) \
        == full.usage.model_dump(exclude={"prompt_tokens_details"})
    # the same prompt again: all of it but its last token came from the prefix cache
    assert last.prompt_tokens_details.cached_tokens == n_prompt - 1


def test_completions_text_is_the_decoded_tokens(client, server, tiny_tokenizer) -> None:
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, extra_body=EXACT)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stream=True, extra_body=EXACT))
    native = httpx.post(f"{server.base}/generate", headers={"Authorization": f"Bearer {API_KEY}"}, json={
        "text": PROMPT, "sampling_params": {"max_tokens": 16, "ignore_eos": True}}, timeout=60).json()
    assert len(native["output_ids"]) == 16
    assert full.choices[0].text == streamed == native["text"]
    # the random model emits stray bytes; their U+FFFD count depends on where decoding splits
    decoded = tiny_tokenizer.decode(native["output_ids"], skip_special_tokens=True)
    assert native["text"].replace("\ufffd", "") == decoded.replace("\ufffd", "")
    assert full.usage.prompt_tokens == len(tiny_tokenizer.encode(PROMPT)) == native["usage"]["prompt_tokens"]


def test_n_two_with_seeds_fans_out(client) -> None:
    two = _chat(client, max_tokens=12, temperature=1.0, seed=7, n=2, extra_body=EXACT)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage.completion_tokens == 24
    one = [_chat(client, max_tokens=12, temperature=1.0, seed=s, extra_body=EXACT).choices[0].message.content
           for s in (7, 8)]
    assert [c.message.content for c in two.choices] == one
    greedy = _chat(client, max_tokens=8, temperature=0, n=2, extra_body=EXACT)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


SAMPLED = {"temperature": 1.0, "max_tokens": 32}


def _stop_across_tokens(server, tiny_tokenizer) -> tuple[int, str, str]:
    """A seed whose sampled text holds 3 printable characters that no single token contains."""
    for seed in range(40):
        out = httpx.post(f"{server.base}/generate", headers={"Authorization": f"Bearer {API_KEY}"}, json={
            "text": PROMPT, "sampling_params": SAMPLED | {"seed": seed, "ignore_eos": True}}, timeout=60).json()
        pieces = [tiny_tokenizer.decode([t]) for t in out["output_ids"]]
        text = out["text"]
        for i in range(2, len(text) - 3):
            stop = text[i : i + 3]
            if stop.isprintable() and "\ufffd" not in stop and not any(stop in p for p in pieces):
                return seed, text, stop
    pytest.fail("no sampled text with a usable stop string")


def test_stop_string_spanning_tokens_is_cut_and_not_included(client, server, tiny_tokenizer) -> None:
    seed, text, stop = _stop_across_tokens(server, tiny_tokenizer)
    expected = text[: text.find(stop)]
    kw = SAMPLED | {"model": "tiny", "prompt": PROMPT, "seed": seed, "stop": [stop], "extra_body": EXACT}
    full = client.completions.create(**kw)
    assert full.choices[0].text == expected and full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens < 32
    chunks = list(client.completions.create(**kw | {"stop": stop, "stream": True}))
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_logprobs(client) -> None:
    r = _chat(client, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, extra_body=EXACT)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob <= 0.0
        assert entry.top_logprobs[0].token == entry.token  # greedy takes the best
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)


def test_completion_logprobs(client) -> None:
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, extra_body=EXACT)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    # greedy picks the best; tokens that decode alike (stray bytes) share one key of the dict
    assert all(1 <= len(t) <= 2 and v >= max(t.values()) - 1e-4 for t, v in zip(lp.top_logprobs, lp.token_logprobs))
    assert all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_content_as_text_parts_equals_string_content(client) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Tell me a story "}, {"type": "text", "text": "about a fox."}]}]
    a = client.chat.completions.create(model="tiny", messages=parts, max_tokens=8, temperature=0, extra_body=EXACT)
    b = _chat(client, max_tokens=8, temperature=0, extra_body=EXACT)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_unknown_model_is_404(client) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-17", messages=MSGS, max_tokens=2)
    assert e.value.body["code"] == "model_not_found"


def test_health_generate_and_metrics(server) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    before = server.metrics()
    assert httpx.get(f"{server.base}/health_generate", headers=auth, timeout=30).status_code == 200
    body = {"model": "tiny", "prompt": "count", "max_tokens": 16, "ignore_eos": True}
    r = httpx.post(f"{server.base}/v1/completions", json=body, headers=auth, timeout=60)
    assert r.status_code == 200
    m = server.metrics()
    key = 'radixserve_requests_total{outcome="length"}'
    assert m[key] - before.get(key, 0) >= 1  # this test's own requests, whatever ran before
    generated = m["radixserve_generation_tokens_total"] - before.get("radixserve_generation_tokens_total", 0)
    assert generated >= 16 and m["radixserve_prompt_tokens_total"] > 0
    assert m["radixserve_kv_pages_total"] > 0
    assert m["radixserve_time_to_first_token_seconds_count"] >= 1
    assert m["radixserve_inter_token_latency_seconds_count"] >= 1


def test_logit_bias_and_min_tokens(client, server) -> None:
    from radixserve.testing import EOS_IDS

    # +100 on one token: greedy picks it every time (checked on the token ids /generate returns)
    native = httpx.post(f"{server.base}/generate", headers={"Authorization": f"Bearer {API_KEY}"}, json={
        "text": PROMPT, "sampling_params": {"max_tokens": 6, "ignore_eos": True,
                                            "logit_bias": {"77": 100}}}, timeout=60).json()
    assert native["output_ids"] == [77] * 6
    # EOS favoured by the client's own logit_bias: min_tokens alone keeps the reply going
    for stream in (False, True):
        r = _chat(client, max_tokens=20, temperature=0, logit_bias={EOS_IDS[0]: 100}, stream=stream,
                  stream_options={"include_usage": True} if stream else None,
                  extra_body={"min_tokens": 4})
        chunks = list(r) if stream else [r]
        assert chunks[-1].usage.completion_tokens == 5  # four held back, then EOS
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_skip_special_tokens_false_keeps_them_in_the_text(client, tiny_tokenizer) -> None:
    """vLLM's `skip_special_tokens`: EOS forced by logit_bias (and ignored) is left out of the text
    by default, and written as its token text with `false`; the same tokens either way."""
    from radixserve.testing import EOS_IDS

    eos = tiny_tokenizer.convert_ids_to_tokens(EOS_IDS[0])
    assert eos in tiny_tokenizer.all_special_tokens
    texts = {}
    for skip in (True, False):
        r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, logprobs=0,
                                      logit_bias={str(EOS_IDS[0]): 100},
                                      extra_body=EXACT | {"skip_special_tokens": skip})
        assert r.usage.completion_tokens == 3
        texts[skip] = r.choices[0].text
    assert texts == {True: "", False: eos * 3}
    streamed = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, stream=True,
                                              logit_bias={str(EOS_IDS[0]): 100},
                                              extra_body=EXACT | {"skip_special_tokens": False})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == eos * 2


def test_continuous_usage_stats_counts_every_chunk(client) -> None:
    """vLLM's `continuous_usage_stats`: every chunk after the opening one carries the usage so
    far (completion tokens growing by the chunk's tokens), the last equal to the final usage."""
    for kind in ("chat", "completion"):
        opts = {"include_usage": True, "continuous_usage_stats": True}
        if kind == "chat":
            chunks = list(_chat(client, max_tokens=8, temperature=0, stream=True, stream_options=opts,
                                extra_body=EXACT))
            chunks = chunks[1:]  # the opening role chunk comes before any token
        else:
            chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                                    stream=True, stream_options=opts, extra_body=EXACT))
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts[-1] == 8 and counts == sorted(counts) and counts[0] >= 1, (kind, counts)
        assert len({c.usage.prompt_tokens for c in chunks}) == 1 and chunks[0].usage.prompt_tokens > 0
        assert chunks[-1].choices == []


def test_truncate_prompt_tokens_keeps_the_end_of_the_prompt(client, server, tiny_tokenizer) -> None:
    """vLLM's `truncate_prompt_tokens`: only the prompt's last N tokens are used: the same greedy
    reply as for those N tokens sent as the prompt."""
    ids = tiny_tokenizer.encode(PROMPT)
    assert len(ids) > 5
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0,
                                    extra_body=EXACT | {"truncate_prompt_tokens": 5})
    tail = client.completions.create(model="tiny", prompt=ids[-5:], max_tokens=6, temperature=0, extra_body=EXACT)
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, extra_body=EXACT)
    assert cut.usage.prompt_tokens == 5 and whole.usage.prompt_tokens == len(ids)
    assert cut.choices[0].text == tail.choices[0].text
    emb = client.embeddings.create(model="tiny", input=PROMPT, extra_body={"truncate_prompt_tokens": 5})
    assert emb.usage.prompt_tokens == 5
    assert emb.data[0].embedding == client.embeddings.create(model="tiny", input=[ids[-5:]]).data[0].embedding
    with pytest.raises(openai.BadRequestError, match="truncate_prompt_tokens"):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, extra_body={"truncate_prompt_tokens": 0})
