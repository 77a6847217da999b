"""A reasoning model's thinking (`<think>…</think>`) apart from its answer, incrementally, as
vLLM's and SGLang's `--reasoning-parser` do: the chat response carries the thinking as
`reasoning_content` and only the rest as `content` (and to the tool-call parser).

`qwen3`: the model opens the block itself (Qwen3 with thinking on); output that does not begin
with `<think>` is all answer, so `enable_thinking: false` (the template closes an empty block in
the prompt) passes through untouched. `deepseek_r1`: the chat template opens the block in the
prompt, so the output starts inside it (an opening tag it writes anyway is dropped); a block that
never closes is all thinking. Whitespace at the start of each part is dropped (the template's
newlines around the tags). Fed whole or a character at a time, the split is the same."""
from __future__ import annotations

from radixserve.config import REASONING_PARSERS
from radixserve.postprocess.auto_tool_parsers import partial_suffix

OPEN, CLOSE = "<think>", "</think>"


class ReasoningParser:
    def __init__(self, mode: str) -> None:
        if mode not in REASONING_PARSERS:
            raise ValueError(f"reasoning parser must be one of {', '.join(REASONING_PARSERS)}, got {mode!r}")
        self.starts_inside = mode == "deepseek_r1"
        self.state = "start"  # start (an opening tag may come) | think | answer
        self.held = ""  # text not yet placed: a possible tag, cut by the end of a delta
        self.at_part_start = True  # leading whitespace of the current part is dropped

    def feed(self, text: str) -> list[tuple[bool, str]]:
        """(is_reasoning, text) pieces, in order, for one delta."""
        self.held += text
        out: list[tuple[bool, str]] = []
        while self.held:
            if self.state == "start":
                head = self.held.lstrip()
                if head.startswith(OPEN):
                    self.held, self.state = head[len(OPEN):], "think"
                elif OPEN.startswith(head):
                    break  # whitespace or a cut tag: wait for more
                else:
                    self.state = "think" if self.starts_inside else "answer"
            elif self.state == "think":
                end = self.held.find(CLOSE)
                if end < 0:
                    keep = partial_suffix(self.held, CLOSE)
                    self._emit(out, True, self.held[:len(self.held) - keep])
                    self.held = self.held[len(self.held) - keep:]
                    break
                self._emit(out, True, self.held[:end])
                self.held, self.state, self.at_part_start = self.held[end + len(CLOSE):], "answer", True
            else:
                self._emit(out, False, self.held)
                self.held = ""
        return out

    def finish(self) -> list[tuple[bool, str]]:
        """What is still held when the output ends: a cut tag is text after all."""
        out: list[tuple[bool, str]] = []
        held, self.held = self.held, ""
        if self.state == "start":
            self.state = "think" if self.starts_inside else "answer"
        self._emit(out, self.state == "think", held)
        return out

    def _emit(self, out: list[tuple[bool, str]], reasoning: bool, text: str) -> None:
        if self.at_part_start:
            text = text.lstrip()
            self.at_part_start = not text
        if text:
            out.append((reasoning, text))
