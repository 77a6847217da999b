"""`--reasoning-parser`: a reasoning model's `<think>` block apart from its answer, without a
server. Every text is fed whole, in 3-character pieces and one character at a time (a stream's
worst case); all must split it the same way."""
from __future__ import annotations

import json

import pytest

from radixserve.postprocess.auto_tool_parsers import HermesParser
from radixserve.postprocess.chat_output import ChatOutput
from radixserve.postprocess.reasoning import ReasoningParser
from radixserve.postprocess.tool_parsers import PlainParser


def _split(mode: str, text: str, chunk: int) -> tuple[str, str]:
    """(reasoning, answer) from feeding `text` in pieces of `chunk` characters."""
    p = ReasoningParser(mode)
    pieces = [p.feed(text[i : i + chunk]) for i in range(0, len(text), chunk)] + [p.finish()]
    return ("".join(t for part in pieces for r, t in part if r),
            "".join(t for part in pieces for r, t in part if not r))


def _both(mode: str, text: str) -> tuple[str, str]:
    whole = _split(mode, text, max(1, len(text)))
    assert _split(mode, text, 1) == whole == _split(mode, text, 3)
    return whole


def test_qwen3_thinking_then_answer() -> None:
    text = "<think>\nThe user asks for the capital.\nIt is Paris.\n</think>\n\nParis is the capital."
    assert _both("qwen3", text) == ("The user asks for the capital.\nIt is Paris.\n", "Paris is the capital.")


def test_qwen3_without_a_block_is_all_answer() -> None:
    # thinking off: Qwen3's template closes an empty block in the prompt, the output has none
    assert _both("qwen3", "Paris.") == ("", "Paris.")
    assert _both("qwen3", "  <thin ice> is not a tag") == ("", "<thin ice> is not a tag")
    assert _both("qwen3", "Answer first <think>then this</think> stays") == \
        ("", "Answer first <think>then this</think> stays")
    assert _both("qwen3", "<thi") == ("", "<thi")  # a cut tag at the end is text after all


def test_unclosed_block_is_all_reasoning_and_cut_close_tag_is_kept() -> None:
    # max_tokens hit while thinking
    assert _both("qwen3", "<think>\nStill working on it </thi") == ("Still working on it </thi", "")
    assert _both("qwen3", "<think>a < b and </b> is html</think>ok") == ("a < b and </b> is html", "ok")


def test_deepseek_r1_starts_inside_the_block() -> None:
    # the template put `<think>\n` in the prompt
    assert _both("deepseek_r1", "Let me think.\n</think>\n\nParis.") == ("Let me think.\n", "Paris.")
    assert _both("deepseek_r1", "<think>\nThinking.</think>Paris.") == ("Thinking.", "Paris.")
    assert _both("deepseek_r1", "never closed") == ("never closed", "")


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="qwen3, deepseek_r1"):
        ReasoningParser("o1")


def test_chat_output_streams_reasoning_then_content_and_tool_calls() -> None:
    """The thinking comes as `reasoning_content` deltas, the answer goes on to the tool-call
    parser: a `<tool_call>` inside the thinking is not a call."""
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    text = f"<think>\nMaybe <tool_call>{call}</tool_call>? Yes.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"
    out = ChatOutput(HermesParser(), ReasoningParser("qwen3"))
    deltas = [d for ch in text for d in out.feed(ch)] + out.feed("", final=True)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning == f"Maybe <tool_call>{call}</tool_call>? Yes.\n"
    first_call = next(i for i, d in enumerate(deltas) if "tool_calls" in d)
    assert all("reasoning_content" in d for d in deltas[:first_call])
    msg = out.message()
    assert msg["reasoning_content"] == reasoning and msg["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == \
        [("get_weather", {"city": "Paris"})]
    assert out.finish_reason("stop") == "tool_calls"


def test_chat_output_without_reasoning_parser_is_unchanged() -> None:
    out = ChatOutput(PlainParser())
    out.feed("<think>x</think>y", final=True)
    assert out.message() == {"role": "assistant", "content": "<think>x</think>y"}
    with_parser = ChatOutput(PlainParser(), ReasoningParser("qwen3"))
    with_parser.feed("Plain answer.", final=True)
    assert with_parser.message() == {"role": "assistant", "content": "Plain answer.", "reasoning_content": None}
