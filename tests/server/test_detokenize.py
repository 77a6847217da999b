from __future__ import annotations

import pytest

from radixserve.messages import TokenMsg
from radixserve.tokenizer.detokenize import DetokenizeManager
from tests.server.byte_tokenizer import make_byte_tokenizer

TEXT = "héllo 日本語 wörld, the fox"


@pytest.fixture(scope="module")
def tok():
    return make_byte_tokenizer()


def _stream(d: DetokenizeManager, uid: int, ids: list[int], last_reason: str = "length"):
    replies = []
    for i, t in enumerate(ids):
        fin = i == len(ids) - 1
        reply, stopped = d.process(TokenMsg(uid, t, fin, last_reason if fin else None, 4))
        replies.append((reply, stopped))
        if reply is not None and reply.finished:
            break
    return replies


def test_multibyte_characters_split_across_tokens_are_never_broken(tok) -> None:
    ids = tok.encode(TEXT)
    assert any("\ufffd" in tok.decode([t]) for t in ids), "the test needs characters split across tokens"
    d = DetokenizeManager(tok)
    d.start(1, [], False)
    replies = [r for r, _ in _stream(d, 1, ids)]
    assert all("\ufffd" not in r.text for r in replies)
    assert "".join(r.text for r in replies) == TEXT
    assert replies[-1].finished and replies[-1].finish_reason == "length"
    assert replies[-1].completion_tokens == len(ids) and replies[-1].prompt_tokens == 4


def test_invalid_bytes_are_not_held_back_forever(tok) -> None:
    stray = tok.encode("é")[-1]  # a lone continuation byte: never valid UTF-8
    ids = [stray] * 8 + tok.encode("ok")
    d = DetokenizeManager(tok)
    d.start(1, [], False)
    replies = [r for r, _ in _stream(d, 1, ids)]
    assert "".join(r.text for r in replies[:8]).count("\ufffd") >= 4, "emitted before the end"
    assert "".join(r.text for r in replies) == tok.decode(ids)


def test_special_tokens_are_skipped(tok) -> None:
    ids = tok.encode("hello") + [tok.convert_tokens_to_ids("<sep>")] + tok.encode(" world") + [tok.eos_token_id]
    d = DetokenizeManager(tok)
    d.start(1, [], False)
    replies = [r for r, _ in _stream(d, 1, ids, "stop")]
    assert "".join(r.text for r in replies) == "hello world"
    d.start(2, [], False, skip_special=False)  # skip_special_tokens: false
    replies = [r for r, _ in _stream(d, 2, ids, "stop")]
    assert "".join(r.text for r in replies) == f"hello<sep> world{tok.eos_token}"


def test_stop_string_across_tokens_finishes_and_asks_for_abort(tok) -> None:
    ids = tok.encode("hello STOP world")
    d = DetokenizeManager(tok)
    d.start(1, ["STOP"], False)
    replies = _stream(d, 1, ids)
    text = "".join(r.text for r, _ in replies)
    assert text == "hello "
    last, stopped = replies[-1]
    assert last.finished and last.finish_reason == "stop" and stopped
    assert len(replies) < len(ids), "nothing after the stop string is processed"


def test_output_after_finish_is_ignored_and_leaves_no_state(tok) -> None:
    """Upstream bug: one more reply after EOS created detokenizer state that was never freed."""
    d = DetokenizeManager(tok)
    d.start(9, [], False)
    reply, _ = d.process(TokenMsg(9, tok.eos_token_id, True, "stop", 3))
    assert reply is not None and reply.finished
    late, stopped = d.process(TokenMsg(9, tok.encode("x")[0], False, None, 3))
    assert late is None and not stopped
    assert d.states == {}


def test_logprobs_carry_token_text(tok) -> None:
    ids = tok.encode("hello")
    d = DetokenizeManager(tok)
    d.start(2, [], True)
    reply, _ = d.process(TokenMsg(2, ids[0], True, "length", 1, -0.5, [[ids[0], -0.5], [ids[-1], -1.5]]))
    assert reply.logprobs[0].token == tok.decode([ids[0]]) and reply.logprobs[0].logprob == -0.5
    assert reply.logprobs[0].top == [[tok.decode([ids[0]]), -0.5], [tok.decode([ids[-1]]), -1.5]]
