"""The server's request pipeline after tokenization, in one process and without sockets: the
scheduler process's calls (`scheduler/lifecycle.py`) and the detokenizer's handling of their
messages (`DetokenizeManager.handle`), wired as the processes are wired. So a request given to
`LLM` or the shell is admitted, stopped (stop strings included) and decoded by the same code as
one sent over HTTP, and gets the same tokens and text.

Single-threaded: `engine_loop.py` serialises its callers."""
from __future__ import annotations

from typing import Any

from radixserve.messages import (
    LoadLoRA,
    LoRAReply,
    RequestFailed,
    TokenBatch,
    UnloadLoRA,
    UserMsg,
    UserReply,
)
from radixserve.scheduler import lifecycle
from radixserve.tokenizer.detokenize import DetokenizeManager

Reply = UserReply | RequestFailed


class LocalPipeline:
    def __init__(self, scheduler, tokenizer) -> None:
        self.scheduler = scheduler  # a `Scheduler`, or a `TPLeader` (the same interface)
        self.detok = DetokenizeManager(tokenizer)

    def submit(self, msg: UserMsg) -> list[Reply]:
        """Admit a request; a refusal comes back at once as RequestFailed."""
        out = lifecycle.admit(self.scheduler, msg)
        return self._detokenize(out) if out is not None else []

    def abort(self, uid: int) -> list[Reply]:
        """Drop a request in any state (before its admission too); a live one ends with a reply
        whose finish_reason is "abort"."""
        out = lifecycle.abort(self.scheduler, uid)
        return self._detokenize(out) if out is not None else []

    def change_lora(self, msg: LoadLoRA | UnloadLoRA) -> LoRAReply:
        """Load or unload a LoRA adapter, as the scheduler process does for the API."""
        return lifecycle.change_lora(self.scheduler, msg)

    def step(self) -> list[Reply]:
        """One scheduler step (none without work): its replies, text already cut at stop strings."""
        if not self.scheduler.has_work:
            return []
        tokens, failed = lifecycle.step(self.scheduler)
        replies = self._detokenize(TokenBatch(tokens)) if tokens else []
        for f in failed:
            replies += self._detokenize(f)
        return replies

    def _detokenize(self, msg: Any) -> list[Reply]:
        replies, aborts = self.detok.handle(msg)
        for uid in aborts:  # a stop string matched: free its KV now, as the detokenizer asks
            if (ack := lifecycle.abort(self.scheduler, uid)) is not None:
                replies += self.detok.handle(ack)[0]  # (ignored: that request already finished)
        return replies
