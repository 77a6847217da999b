"""Incremental detokenization: per request, decode a small window of recent tokens and emit only
complete characters (a window ending in U+FFFD still lacks bytes of a multi-byte character),
skipping special tokens and applying stop strings. Outputs for requests already finished are
ignored (NOTE: upstream created fresh state for a token arriving after EOS and never freed it).

`handle` takes the scheduler's messages as they come, and is all the detokenizer process does
with them (`tokenizer/worker.py`); the in-process engine (`offline/pipeline.py`) calls it too, so
`LLM` and the server stop and decode alike."""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from radixserve.messages import (
    AbortMsg,
    RequestFailed,
    RequestStarted,
    TokenBatch,
    TokenLogprob,
    TokenMsg,
    UserReply,
)
from radixserve.tokenizer.stop import StopStringMatcher

logger = logging.getLogger("radixserve.tokenizer")

_FINISHED_MEMORY = 1 << 16  # how many finished uids to remember (uids are never reused)
_MAX_HELD = 4  # a UTF-8 character has at most 4 bytes: bytes held this long are invalid, not split


@dataclass
class _DecodeState:
    stop: StopStringMatcher
    want_logprobs: bool = False
    min_tokens: int = 0  # stop strings are looked for from this token on (vLLM's min_tokens)
    skip_special: bool = True  # special tokens left out of the text
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0  # start of the decode window (gives the first token its context)
    read_offset: int = 0  # tokens up to here are already emitted as text


class DetokenizeManager:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[int, _DecodeState] = {}
        self.finished: OrderedDict[int, None] = OrderedDict()

    def start(self, uid: int, stop: list[str], want_logprobs: bool, min_tokens: int = 0,
              skip_special: bool = True) -> None:
        """Register a request (before its first token) so its stop strings are known."""
        if uid not in self.finished:
            self.states[uid] = _DecodeState(StopStringMatcher(stop), want_logprobs, min_tokens,
                                            skip_special)

    def is_active(self, uid: int) -> bool:
        return uid in self.states

    def finish(self, uid: int) -> None:
        self.states.pop(uid, None)
        self.finished[uid] = None
        while len(self.finished) > _FINISHED_MEMORY:
            self.finished.popitem(last=False)

    def _decode(self, s: _DecodeState, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(s.ids[start:end], skip_special_tokens=s.skip_special)

    def _new_text(self, s: _DecodeState, final: bool) -> str:
        prefix = self._decode(s, s.prefix_offset, s.read_offset)
        full = self._decode(s, s.prefix_offset)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            s.prefix_offset, s.read_offset = s.read_offset, len(s.ids)
            return full[len(prefix) :]
        if final:  # a character still incomplete at the end is dropped, never emitted broken
            return full[len(prefix) :].rstrip("\ufffd")
        if len(s.ids) - s.read_offset >= _MAX_HELD:  # emit all but the tokens a char may still need
            cut = len(s.ids) - (_MAX_HELD - 1)
            text = self._decode(s, s.prefix_offset, cut)[len(prefix) :]
            s.prefix_offset, s.read_offset = s.read_offset, cut
            return text
        return ""

    def _logprob(self, out: TokenMsg) -> TokenLogprob:
        top = [[self.tokenizer.decode([t]), lp] for t, lp in (out.top_logprobs or [])]
        lp = out.logprob if out.logprob is not None else 0.0
        return TokenLogprob(self.tokenizer.decode([out.token_id]), lp, top)

    def _prompt_logprobs(self, rows: list[list]) -> tuple[list[TokenLogprob], str]:
        """Each prompt token's text, logprob and best alternatives; and the whole prompt's text."""
        lps = [TokenLogprob(self.tokenizer.decode([t]), lp,
                            [[self.tokenizer.decode([i]), v] for i, v in best])
               for t, lp, best in rows]
        return lps, self.tokenizer.decode([row[0] for row in rows])

    def process(self, out: TokenMsg) -> tuple[UserReply | None, bool]:
        """One scheduler output → (reply for the API or None, True if a stop string matched and the
        scheduler must abort the request)."""
        s = self.states.get(out.uid)
        if s is None:
            if out.uid in self.finished:
                return None, False
            s = self.states[out.uid] = _DecodeState(StopStringMatcher([]))
        if out.embedding is not None:  # an embedding: no token, nothing to decode
            self.finish(out.uid)
            return UserReply(out.uid, "", [], True, out.finish_reason, out.prompt_tokens, 0,
                             embedding=out.embedding, cached_tokens=out.cached_tokens), False
        s.ids.append(out.token_id)
        text = self._new_text(s, final=out.finished)
        # before min_tokens no stop string counts; one that began before it is not matched after
        text, stopped = s.stop.feed(text) if len(s.ids) >= s.min_tokens else (text, False)
        finished = out.finished or stopped
        if out.finished and not stopped:
            text += s.stop.flush()
        reply = UserReply(
            uid=out.uid,
            text=text,
            token_ids=[out.token_id],
            finished=finished,
            finish_reason="stop" if stopped else out.finish_reason,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=len(s.ids),
            logprobs=[self._logprob(out)] if s.want_logprobs else None,
            cached_tokens=out.cached_tokens,
            spec_drafted=out.spec_drafted,
            spec_accepted=out.spec_accepted,
            spec_steps=out.spec_steps,
        )
        if stopped:
            reply.matched_stop = s.stop.matched
        elif out.finished and out.finish_reason == "stop":
            reply.matched_stop = out.token_id
        if out.prompt_logprobs is not None:
            reply.prompt_logprobs, reply.prompt_text = self._prompt_logprobs(out.prompt_logprobs)
        if finished:
            self.finish(out.uid)
        return reply, stopped and not out.finished

    def handle(self, msg: Any) -> tuple[list[UserReply | RequestFailed], list[int]]:
        """One message from the scheduler → (replies for the caller, uids the scheduler must
        abort: a stop string matched, or detokenizing failed)."""
        replies: list[UserReply | RequestFailed] = []
        aborts: list[int] = []
        if isinstance(msg, TokenBatch):
            for out in msg.outputs:
                try:
                    reply, stopped = self.process(out)
                except Exception:  # fail this request alone and stop its generation
                    logger.exception("detokenizer: could not detokenize request %d", out.uid)
                    self.finish(out.uid)
                    replies.append(RequestFailed(out.uid, "internal error while detokenizing",
                                                 status=500))
                    aborts.append(out.uid)
                    continue
                if reply is not None:
                    replies.append(reply)
                if stopped:  # free the request's KV now, not at max_tokens
                    aborts.append(out.uid)
        elif isinstance(msg, RequestStarted):
            self.start(msg.uid, msg.stop, msg.logprobs, msg.min_tokens, msg.skip_special_tokens)
        elif isinstance(msg, AbortMsg):
            if self.is_active(msg.uid) or msg.uid not in self.finished:
                self.finish(msg.uid)
                replies.append(UserReply(msg.uid, "", [], True, "abort"))
        elif isinstance(msg, RequestFailed):
            self.finish(msg.uid)
            replies.append(msg)
        else:
            logger.error("detokenizer: unexpected message %r", type(msg).__name__)
        return replies, aborts
