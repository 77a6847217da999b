"""`tool_choice: auto`: the model's own tool-call format, parsed from free text (the format is the
one its chat template teaches, `detect_tool_parser`).

- `HermesParser`: Qwen's and Hermes' `<tool_call>{"name", "arguments"}</tool_call>`, any number,
  amid text.
- `Llama3JsonParser`: Llama 3.x's `{"name", "parameters"}` objects (`;` between them), maybe
  after `<|python_tag|>`; output that starts otherwise is content.

Free text can be malformed and a streamed call cannot be taken back: text that may still become a
call is held back, a call is emitted once it is complete and parses, else its text is content.
Whitespace around calls is no content."""
from __future__ import annotations

import json

from radixserve.postprocess.tool_parsers import Event, JsonDepth, ToolParser


def detect_tool_parser(chat_template: str | dict | None) -> str | None:
    """The tool-call format a chat template teaches its model: `hermes`, `llama3` or None."""
    text = "\n".join(chat_template.values()) if isinstance(chat_template, dict) else chat_template or ""
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_tag|>" in text or ("<|start_header_id|>" in text and "tool_calls" in text):
        return "llama3"
    return None


class HermesParser(ToolParser):
    """Qwen's and Hermes' `<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`, any number,
    amid text."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, parallel: bool = True) -> None:
        super().__init__()
        self.parallel = parallel
        self.buf, self.in_call = "", False
        self.space = ""  # whitespace held: a separator around calls is not content

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        while True:
            if not self.in_call:
                i = self.buf.find(self.OPEN)
                if i < 0:
                    keep = partial_suffix(self.buf, self.OPEN)
                    self._text(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                self._text(self.buf[:i])
                self.buf, self.in_call, self.space = self.buf[i + len(self.OPEN):], True, ""
            else:
                j = self.buf.find(self.CLOSE)
                if j < 0:
                    break
                self._call(self.buf[:j], self.OPEN + self.buf[: j + len(self.CLOSE)])
                self.buf, self.in_call = self.buf[j + len(self.CLOSE):], False
        return self._take()

    def finish(self) -> list[Event]:
        if self.in_call:  # no closing tag (the model stopped right after the JSON, or ran out)
            self._call(self.buf, self.OPEN + self.buf)
        else:
            self._text(self.buf)
        if not self.calls:
            self._content(self.space)
        self.buf = self.space = ""
        return self._take()

    def _text(self, text: str) -> None:
        """Content up to its last visible character; trailing whitespace waits for what follows."""
        text = self.space + text
        body = text.rstrip()
        self._content(body)
        self.space = text[len(body):]

    def _call(self, body: str, raw: str) -> None:
        call = parse_call(body)
        if call is None:
            self._text(raw)
        elif self.parallel or not self.calls:
            self._args(self._start(call[0]), call[1])


class Llama3JsonParser(ToolParser):
    """Llama 3.x's JSON tool calls: the output is `{"name": …, "parameters": …}` objects (`;`
    between them), maybe after `<|python_tag|>`; output starting otherwise is content."""

    TAG = "<|python_tag|>"

    def __init__(self, parallel: bool = True) -> None:
        super().__init__()
        self.parallel = parallel
        self.state = "start"  # start | json | between | content
        self.raw = ""  # text of the state, kept to become content if it is no call after all
        self.lex = JsonDepth()

    def feed(self, text: str) -> list[Event]:
        for i, ch in enumerate(text):
            if self.state == "content":
                self._content(text[i:])
                break
            self.raw += ch
            if self.state == "json":
                self.lex.push(ch)
                if self.lex.depth == 0:
                    self._object()
            elif self.state == "start":
                head = self.raw.lstrip()
                if head.startswith(self.TAG):
                    head = head[len(self.TAG):].lstrip()
                if head.startswith("{"):
                    self._json(head)
                elif head and not self.TAG.startswith(head) and not head.startswith(self.TAG):
                    self.state = "content"
                    self._content(self.raw)
            elif ch == "{":  # between calls
                self._json("{")
            elif not (ch.isspace() or ch == ";"):
                self.state = "content"
                self._content(ch)
        return self._take()

    def _json(self, head: str) -> None:
        self.state, self.raw, self.lex = "json", head, JsonDepth()
        for c in head:
            self.lex.push(c)

    def _object(self) -> None:
        call = parse_call(self.raw)
        if call is None:
            self.state = "content"
            self._content(self.raw)
            return
        if self.parallel or not self.calls:
            self._args(self._start(call[0]), call[1])
        self.state, self.raw = "between", ""

    def finish(self) -> list[Event]:
        if self.state in ("start", "json") and self.raw:
            self._content(self.raw)
        self.raw = ""
        return self._take()


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (it may be the tag, cut)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of `{"name": …, "arguments" | "parameters": {…}}`, or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


AUTO_PARSERS: dict[str, type[HermesParser | Llama3JsonParser]] = {
    "hermes": HermesParser, "llama3": Llama3JsonParser,
}
