"""Speculative decoding (`--speculative-algorithm ngram`, trees of up to three matches) through a
real server and the official `openai` client: greedy completions and chat completions are the
plain server's tokens (the `server` fixture: the same tiny random llama, no speculation), usage's
`speculative` extension counts the drafts verified for a repetitive prompt, a stream gives the
same text as the whole answer, and /metrics counts the drafts."""
from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from tests.server.server_process import API_KEY, ServerProcess

REPEATS = "the cat sat on the mat. " * 6  # prompt lookup finds its continuations
CHAT = [{"role": "user", "content": REPEATS}]
MAX_NEW = 32
GREEDY = {"max_tokens": MAX_NEW, "temperature": 0, "extra_body": {"ignore_eos": True}}
SPEC_FIELDS = {"draft_tokens", "accepted_tokens", "verify_steps", "accept_rate", "accept_length"}
DRAFTED, ACCEPTED, STEPS = ("radixserve_spec_draft_tokens_total",
                            "radixserve_spec_accepted_tokens_total",
                            "radixserve_spec_verify_steps_total")
ACCEPT_LENGTH = "sglang:spec_accept_length"


@pytest.fixture(scope="module")
def spec_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """As the `server` fixture, with the n-gram drafter drafting trees (a request asking for
    logprobs drafts its first candidate alone)."""
    log = tmp_path_factory.mktemp("spec-server") / "server.log"
    srv = ServerProcess(tiny_model, log, "--api-key", API_KEY, "--served-model-name", "tiny",
                        "--max-kv-tokens", "4096", "--speculative-algorithm", "ngram",
                        "--speculative-ngram-max-bfs-breadth", "3", "--page-size", "1")
    srv.wait_ready()
    yield srv, srv.metrics()  # (/metrics before any request)
    assert srv.stop() == 0, srv.log()[-3000:]


def _client(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def spec(spec_server) -> openai.OpenAI:
    return _client(spec_server[0])


@pytest.fixture(scope="module")
def plain(server) -> openai.OpenAI:
    return _client(server)


def _speculative(usage) -> dict:
    """Usage's extension block, checked for its fields and their arithmetic."""
    got = (usage.model_extra or {}).get("speculative")
    assert got is not None, usage
    assert set(got) == SPEC_FIELDS, got
    drafted, kept, steps = got["draft_tokens"], got["accepted_tokens"], got["verify_steps"]
    assert drafted >= kept > 0 and steps > 0, got
    assert got["accept_rate"] == round(kept / drafted, 4)
    assert got["accept_length"] == round((kept + steps) / steps, 4) > 1
    return got


def test_completions_are_the_plain_tokens_and_usage_counts_the_drafts(spec, plain) -> None:
    want = plain.completions.create(model="tiny", prompt=REPEATS, **GREEDY)
    got = spec.completions.create(model="tiny", prompt=REPEATS, **GREEDY)
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.completion_tokens == want.usage.completion_tokens == MAX_NEW
    assert "speculative" not in (want.usage.model_extra or {})  # plain decoding verifies nothing
    _speculative(got.usage)
    # token for token, with the target's logprobs at each kept position
    want = plain.completions.create(model="tiny", prompt=REPEATS, logprobs=2, **GREEDY)
    got = spec.completions.create(model="tiny", prompt=REPEATS, logprobs=2, **GREEDY)
    assert got.choices[0].logprobs.tokens == want.choices[0].logprobs.tokens
    assert got.choices[0].logprobs.token_logprobs == pytest.approx(
        want.choices[0].logprobs.token_logprobs, abs=1e-4)
    _speculative(got.usage)


def test_chat_is_the_plain_answer_and_usage_counts_the_drafts(spec, plain) -> None:
    want = plain.chat.completions.create(model="tiny", messages=CHAT, **GREEDY)
    got = spec.chat.completions.create(model="tiny", messages=CHAT, **GREEDY)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.completion_tokens == want.usage.completion_tokens == MAX_NEW
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    _speculative(got.usage)


def test_a_stream_gives_the_whole_answers_text(spec) -> None:
    full = spec.completions.create(model="tiny", prompt=REPEATS, **GREEDY)
    chunks = list(spec.completions.create(model="tiny", prompt=REPEATS, stream=True,
                                          stream_options={"include_usage": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == MAX_NEW
    _speculative(chunks[-1].usage)

    full = spec.chat.completions.create(model="tiny", messages=CHAT, **GREEDY)
    chunks = list(spec.chat.completions.create(model="tiny", messages=CHAT, stream=True,
                                               stream_options={"include_usage": True}, **GREEDY))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    _speculative(chunks[-1].usage)


def test_metrics_count_the_drafts(spec, spec_server) -> None:
    srv, at_start = spec_server
    before = srv.metrics()
    out = _speculative(spec.completions.create(model="tiny", prompt=REPEATS, **GREEDY).usage)
    # the scheduler reports its totals every 0.25 s: wait for the report after this request
    deadline = time.monotonic() + 10
    while True:
        after = srv.metrics()
        if (after[DRAFTED] - before[DRAFTED] >= out["draft_tokens"]
                or time.monotonic() > deadline):
            break
        time.sleep(0.1)
    for name, n in ((DRAFTED, out["draft_tokens"]), (ACCEPTED, out["accepted_tokens"]),
                    (STEPS, out["verify_steps"])):
        assert at_start[name] == 0 and after[name] - before[name] >= n > 0, name
    assert after[ACCEPTED] <= after[DRAFTED]
    # SGLang's gauge: tokens a verification step produced (kept drafts + 1), over the server's life
    assert at_start[ACCEPT_LENGTH] == 0
    assert after[ACCEPT_LENGTH] == pytest.approx((after[ACCEPTED] + after[STEPS]) / after[STEPS])
    assert after[ACCEPT_LENGTH] > 1
