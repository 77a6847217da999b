"""One constrained request's position in its grammar: an xgrammar matcher over the shared
compiled grammar (the n choices of a request each have their own)."""
from __future__ import annotations

from typing import Any


class GrammarState:
    def __init__(self, compiled: Any, param: str) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.param = param  # the SamplingParams field that gave the grammar
        self.dead_end = False  # it allowed no token at all when last masked: the request fails

    def accept(self, token: int) -> bool:
        """Advance by one sampled token; False if the grammar forbids it (the mask makes that a
        bug, never a model's choice)."""
        return self.matcher.accept_token(token)

    @property
    def terminated(self) -> bool:
        """The grammar is complete and a stop token (the model's EOS) was accepted."""
        return self.matcher.is_terminated()
