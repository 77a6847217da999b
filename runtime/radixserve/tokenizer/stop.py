"""Stop strings over streamed text: never emit a stop string, even when it arrives split across
tokens, by holding back the longest tail that could still begin one."""
from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> tuple[str, bool]:
        """Add `text`; return (what is safe to emit now, whether a stop string matched).
        The stop string that *ends* first wins (as it would token by token), so the result does not
        depend on how the text was split; from it on, the text is dropped."""
        if not self.stops:
            return text, False
        buf = self.held + text
        hits = [(i + len(s), i) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            end, start = min(hits)
            self.held, self.matched = "", buf[start:end]
            return buf[:start], True
        keep = self._longest_partial(buf)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out

    def _longest_partial(self, buf: str) -> int:
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
