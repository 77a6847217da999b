"""Generated text → content and tool calls, incrementally: a parser is fed the text deltas of one
choice and returns events (`Content`, `CallStart`, `CallArgs`); a full response is the same parser
fed the whole text, so streamed and non-streamed answers agree by construction.

Here the parsers of output forced by a grammar (`tool_choice` a named function, or `required`).
A call is sent once its JSON is complete: output cut before that (`max_tokens`) comes back as
content, never as a call whose arguments are broken, and a stream tells the same as the whole
answer (a call sent cannot be taken back). `auto_tool_parsers` parses free text.
"""
from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from typing import NamedTuple


class Content(NamedTuple):
    text: str


class CallStart(NamedTuple):
    index: int
    id: str
    name: str


class CallArgs(NamedTuple):
    index: int
    text: str  # a fragment of the arguments' JSON text


Event = Content | CallStart | CallArgs


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"

class JsonDepth:
    """Container depth of JSON text read one character at a time (brackets in strings skipped)."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped = 0, False, False

    def push(self, ch: str) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1


class ToolParser(ABC):
    """One choice's text → events. Consecutive content or argument text of one `feed` comes as
    one event, so a stream sends one delta per piece, not per character."""

    def __init__(self) -> None:
        self.calls = 0
        self._events: list[Event] = []

    @abstractmethod
    def feed(self, text: str) -> list[Event]:
        """Events for the new text (possibly none: text held back)."""

    def finish(self) -> list[Event]:
        """Events for what was held back, once the generation ended."""
        return []

    def _start(self, name: str) -> int:
        self._events.append(CallStart(self.calls, new_call_id(), name))
        self.calls += 1
        return self.calls - 1

    def _args(self, index: int, text: str) -> None:
        if not text:
            return
        last = self._events[-1] if self._events else None
        if isinstance(last, CallArgs) and last.index == index:  # one fragment per feed
            self._events[-1] = CallArgs(index, last.text + text)
        else:
            self._events.append(CallArgs(index, text))

    def _content(self, text: str) -> None:
        if not text:
            return
        if self._events and isinstance(self._events[-1], Content):
            self._events[-1] = Content(self._events[-1].text + text)
        else:
            self._events.append(Content(text))

    def _take(self) -> list[Event]:
        out, self._events = self._events, []
        return out


class PlainParser(ToolParser):
    """No tool calls: everything is content."""

    def feed(self, text: str) -> list[Event]:
        self._content(text)
        return self._take()


class NamedCallParser(ToolParser):
    """The whole output is the arguments of one call to a known function (a JSON value)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.lex = JsonDepth()
        self.begun = self.done = False
        self.raw: list[str] = []  # the output so far, whitespace included
        self.value: list[str] = []  # the arguments' JSON text

    def feed(self, text: str) -> list[Event]:
        for ch in text:
            if self.done:
                break
            self.raw.append(ch)
            if not self.begun and ch.isspace():
                continue
            lex = self.lex
            if self.begun and lex.depth == 0 and not lex.in_string and ch.isspace():
                self.done = True  # a bare number or literal ended
                break
            self.begun = True
            self.value.append(ch)
            lex.push(ch)
            self.done = lex.depth == 0 and not lex.in_string and ch in '}]"'
        if self.done:
            self._send()
        return self._take()

    def finish(self) -> list[Event]:
        if not self.done and _is_json("".join(self.value)):  # a bare number or literal at the end
            self.done = True
            self._send()
        elif not self.done:
            self._content("".join(self.raw))  # cut before the arguments were complete
        return self._take()

    def _send(self) -> None:
        if not self.calls:
            self._args(self._start(self.name), "".join(self.value))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class RequiredCallsParser(ToolParser):
    """The output is `[{"name": …, "parameters": …}, …]` (the grammar of `required_calls_schema`):
    each element becomes a call, its `parameters` value the arguments, once the element closes."""

    def __init__(self) -> None:
        super().__init__()
        self.lex = JsonDepth()
        self.closed = False  # the array ended
        self.pending: list[str] = []  # the output since the last call sent
        self._element(False)

    def _element(self, expect_key: bool) -> None:
        self.expect_key, self.key, self.in_value = expect_key, None, False
        self.token: list[str] = []  # a string token at the element's level (a key or a value)
        self.name: str | None = None
        self.params: list[str] = []

    def feed(self, text: str) -> list[Event]:
        lex = self.lex
        for ch in text:
            self.pending.append(ch)
            d0, s0 = lex.depth, lex.in_string
            lex.push(ch)
            d1, s1 = lex.depth, lex.in_string
            if d0 == 1 and d1 == 0:
                self.closed = True
            if d0 == 1 and d1 == 2:  # a call's object opens
                self._element(True)
                continue
            if d0 == 2 and d1 == 1:  # …and closes
                self._send()
                continue
            level = d0 == 2 and d1 == 2  # a character of the element object itself
            if level and (s0 or s1):
                self.token.append(ch)
                if s0 and not s1:  # a string token ended
                    self._string(json.loads("".join(self.token)))
                    self.token = []
            elif level and ch == ":":
                self.in_value = True
                continue
            elif level and ch == ",":
                self.expect_key, self.key, self.in_value = True, None, False
                continue
            if self.key == "parameters" and self.in_value and (not level or s0 or s1 or not ch.isspace()):
                self.params.append(ch)
        return self._take()

    def finish(self) -> list[Event]:
        rest = "".join(self.pending)
        if not self.closed and rest.strip():  # cut inside the array: what is left is no call
            self._content(rest)
        return self._take()

    def _string(self, value: str) -> None:
        if self.expect_key:
            self.key, self.expect_key = value, False
        elif self.key == "name" and self.name is None:
            self.name = value

    def _send(self) -> None:
        if self.name is not None:
            self._args(self._start(self.name), "".join(self.params))
        self.pending = []
        self._element(False)
