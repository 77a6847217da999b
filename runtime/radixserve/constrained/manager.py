"""Grammar-constrained requests inside one scheduler.

A constrained request (`SamplingParams.json_schema`, `regex` or `ebnf`) waits here from
`add_request` until its grammar is compiled (`submit`; the compilation runs on a thread pool,
shared with every request of the same grammar), outside the scheduler's queue, so it holds no KV
and blocks nobody. `admit` then gives it a matcher (the scheduler queues it like any other
request) or fails it with a `RequestFailure` naming the field (HTTP 400: the grammar is invalid,
admits no output, or is over the compile limits of `compiler.py`). A request aborted while it
waits is forgotten, and its compilation stopped unless another request waits for the same
grammar. In a batch, the scheduler masks the logits of its constrained rows before sampling
(`mask`, which names the rows whose grammar allows no token at all: they fail, alone); each token
read back advances the request's matcher, and a terminated matcher (grammar complete, then the
model's EOS) finishes the request with "stop".

Tensor parallelism: which requests are admitted in a step must not depend on each rank's compile
timing. The leader picks the uids whose compilation is done (`ready`) and broadcasts them; every
rank `admit`s exactly those, blocking on its own compilation (begun at the same add) if late.
The time limit is the leader's alone for the same reason (only the deciding rank calls `ready`).
"""
from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import TYPE_CHECKING

from radixserve.constrained.bitmask import GrammarMasker
from radixserve.constrained.compiler import CompileLimits, GrammarCompiler
from radixserve.constrained.grammar_calls import GrammarError
from radixserve.constrained.matcher import GrammarState
from radixserve.core.output import RequestFailure

if TYPE_CHECKING:
    import torch

    from radixserve.core.request import Req

logger = logging.getLogger(__name__)


class GrammarManager:
    def __init__(self, model_path: Path, vocab_size: int, stop_ids: set[int],
                 limits: CompileLimits | None = None) -> None:
        self.compiler = GrammarCompiler(model_path, vocab_size, stop_ids,
                                        limits or CompileLimits.from_env())
        self.masker = GrammarMasker()
        self._pending: dict[int, tuple[Req, Future]] = {}  # uid -> request, its compilation

    def __len__(self) -> int:
        """Requests waiting for their grammar."""
        return len(self._pending)

    def submit(self, req: Req) -> None:
        kind, text = req.params.grammar
        self._pending[req.uid] = (req, self.compiler.compile(kind, text))

    def discard(self, uid: int) -> bool:
        """Forget a waiting request (aborted; stopping its compilation if no other request waits
        for the grammar); False if it is not waiting here."""
        entry = self._pending.pop(uid, None)
        if entry is None:
            return False
        grammar = entry[0].params.grammar
        if all(r.params.grammar != grammar for r, _ in self._pending.values()):
            self.compiler.cancel(*grammar)
        return True

    def ready(self, wait_s: float = 0.0) -> list[int]:
        """The uids whose compilation has ended (either way), in arrival order; compilations past
        the time limit are stopped first (they end as failures). If none has ended, wait up to
        `wait_s` for one (an idle scheduler would otherwise spin)."""
        if self.compiler.pending:
            self.compiler.expire()
        futures = [f for _, f in self._pending.values()]
        if wait_s > 0 and futures and not any(f.done() for f in futures):
            wait(futures, wait_s, FIRST_COMPLETED)
        return [uid for uid, (_, f) in self._pending.items() if f.done()]

    def admit(self, uids: list[int]) -> tuple[list[Req], list[RequestFailure]]:
        """Take `uids` out of waiting (blocking on compilations not yet done): the requests now
        holding a matcher, and the failures of the others."""
        ready, failed = [], []
        for uid in uids:
            req, fut = self._pending.pop(uid)
            kind = req.params.grammar[0]
            try:
                req.grammar = GrammarState(fut.result(), kind)
            except GrammarError as e:
                failed.append(RequestFailure(uid, str(e), e.param))
            except Exception:  # not the grammar's fault (e.g. no tokenizer): it alone fails
                logger.exception("grammar: could not compile the %s of request %d", kind, uid)
                failed.append(RequestFailure(
                    uid, f"{kind}: internal error while compiling the grammar", kind, 500))
            else:
                ready.append(req)
        return ready, failed

    def mask(self, logits: torch.Tensor, rows: list[tuple[int, GrammarState]]) -> list[int]:
        """Mask the constrained rows of `logits`; the row indices whose grammar allows no token."""
        return self.masker.apply(logits, rows)
