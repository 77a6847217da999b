"""One chat choice's output as OpenAI shapes it: the parser's events become stream deltas (a call
as `{"index", "id", "type", "function": {"name", "arguments": ""}}`, then argument fragments
`{"index", "function": {"arguments"}}`) and, at the end, the message (`content` null when there
are calls) and the finish reason (`tool_calls` when the model stopped after calling)."""
from __future__ import annotations

from radixserve.server.tool_parsers import CallArgs, CallStart, Content, Event, ToolParser


class ChatOutput:
    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.content: list[str] = []
        self.calls: list[dict] = []
        self.finished = False

    def feed(self, text: str, final: bool = False) -> list[dict]:
        """The deltas for new text; `final`: the generation ended with it."""
        events = self.parser.feed(text) if text else []
        if final and not self.finished:
            self.finished = True
            events += self.parser.finish()
        return [self._delta(e) for e in events]

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
        if not self.calls:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": text or None, "tool_calls": self.calls}
