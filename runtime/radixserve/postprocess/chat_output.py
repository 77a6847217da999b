"""One chat choice's output as OpenAI shapes it: the parser's events become stream deltas (a call
as `{"index", "id", "type", "function": {"name", "arguments": ""}}`, then argument fragments
`{"index", "function": {"arguments"}}`) and, at the end, the message (`content` null when there
are calls) and the finish reason (`tool_calls` when the model stopped after calling). With a
reasoning parser, the thinking comes out first as `reasoning_content` deltas; only the answer
reaches the tool-call parser."""
from __future__ import annotations

from radixserve.postprocess.reasoning import ReasoningParser
from radixserve.postprocess.tool_parsers import CallArgs, CallStart, Content, Event, ToolParser


class ChatOutput:
    def __init__(self, parser: ToolParser, reasoning: ReasoningParser | None = None) -> None:
        self.parser = parser
        self.reasoning_parser = reasoning
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: list[dict] = []
        self.finished = False

    def feed(self, text: str, final: bool = False) -> list[dict]:
        """The deltas for new text; `final`: the generation ended with it."""
        ending = final and not self.finished
        self.finished |= final
        if self.reasoning_parser is None:
            pieces = [(False, text)] if text else []
        else:
            pieces = self.reasoning_parser.feed(text) + (self.reasoning_parser.finish() if ending else [])
        deltas: list[dict] = []
        for thinking, piece in pieces:
            if thinking:
                self.reasoning.append(piece)
                deltas.append({"reasoning_content": piece})
            else:
                deltas += [self._delta(e) for e in self.parser.feed(piece)]
        if ending:
            deltas += [self._delta(e) for e in self.parser.finish()]
        return deltas

    def _delta(self, e: Event) -> dict:
        if isinstance(e, Content):
            self.content.append(e.text)
            return {"content": e.text}
        if isinstance(e, CallStart):
            self.calls.append({"id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}})
            return {"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                    "function": {"name": e.name, "arguments": ""}}]}
        assert isinstance(e, CallArgs)
        self.calls[e.index]["function"]["arguments"] += e.text
        return {"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]}

    def finish_reason(self, engine_reason: str | None) -> str | None:
        return "tool_calls" if self.calls and engine_reason == "stop" else engine_reason

    def message(self) -> dict:
        text = "".join(self.content)
        msg: dict = {"role": "assistant", "content": text}
        if self.reasoning_parser is not None:
            msg["reasoning_content"] = "".join(self.reasoning) or None
        if self.calls:
            msg |= {"content": text or None, "tool_calls": self.calls}
        return msg
