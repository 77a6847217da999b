"""Grammar compilation with xgrammar on a thread pool, off the scheduler's critical path, with the
compiled grammars kept by (kind, text) so the n choices of one request and repeated schemas
compile once.

A grammar can cost minutes and gigabytes to compile (a JSON schema with thousands of optional
properties), so every compilation is bounded:
- memory: it is first tried in a child process with at most `CompileLimits.memory_mb` MiB
  (`trial.py`); only a grammar that passes is compiled in-process, for about what the trial took;
- time: `expire()` stops a trial that has run `CompileLimits.timeout_s` (called by the scheduler
  that decides admissions: at TP > 1 rank 0 alone, so the ranks never disagree about a clock);
- abandonment: `cancel()` stops the compilation of a grammar no request waits for any more (its
  requests were aborted): it leaves the queue, or its trial is killed, and frees its worker;
- the cache: at most `max_cached` grammars and `max_cached_bytes` of them.

The tokenizer (for xgrammar's `TokenizerInfo`) and xgrammar itself are loaded by the first
compilation, in a worker thread: a server that never sees a constrained request pays nothing."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixserve import settings
from radixserve.constrained.grammar_calls import GrammarError, compile_grammar, dead_end
from radixserve.constrained.trial import try_compile

logger = logging.getLogger(__name__)

MAX_CACHED = 256  # compiled grammars kept (least recently used evicted)
_WORKERS = 2
_CAN_FORK = hasattr(os, "fork") and os.path.exists("/proc/self/status")  # trial.py needs Linux

Key = tuple[str, str]  # (SamplingParams grammar field, its text)


@dataclass(frozen=True)
class CompileLimits:
    timeout_s: float = 30.0  # a trial running longer is stopped (`expire`)
    memory_mb: int = 2048  # more memory than the scheduler's own, for one compilation
    cache_mb: int = 512  # compiled grammars kept, by xgrammar's own count of their size

    @classmethod
    def from_env(cls) -> CompileLimits:
        return cls(settings.GRAMMAR_COMPILE_TIMEOUT_S.get(), settings.GRAMMAR_COMPILE_MEMORY_MB.get(),
                   settings.GRAMMAR_CACHE_MB.get())


class _Job:
    """One compilation on its way: read and written by the scheduler thread and by its worker."""

    def __init__(self) -> None:
        self.future: Future | None = None
        self.stop = threading.Event()  # kills the trial
        self.why = "cancelled"  # the failure the stop means
        self.started: float | None = None  # monotonic, when its trial began
        self.in_process = False  # past its trial: it cannot be stopped any more


class GrammarCompiler:
    def __init__(self, model_path: Path, vocab_size: int, stop_ids: set[int],
                 limits: CompileLimits | None = None, max_cached: int = MAX_CACHED) -> None:
        self.model_path, self.vocab_size, self.stop_ids = model_path, vocab_size, stop_ids
        self.limits = limits or CompileLimits()
        self.max_cached = max_cached
        self._cache: OrderedDict[Key, Future] = OrderedDict()  # scheduler thread only
        self._jobs: dict[Key, _Job] = {}  # compilations not known to be done; scheduler thread only
        self._executor: ThreadPoolExecutor | None = None
        self._info: Any = None  # xgrammar.TokenizerInfo, built by the first compilation
        self._xgr: Any = None  # xgrammar.GrammarCompiler
        self._lock = threading.Lock()

    def compile(self, kind: str, text: str) -> Future:
        """A future of the `xgrammar.CompiledGrammar` for `kind` (a SamplingParams grammar field)
        and `text`; it raises `GrammarError` if the grammar is invalid, admits no output or is
        over a limit."""
        key = (kind, text)
        fut = self._cache.get(key)
        if fut is not None and not (fut.done() and _internal_failure(fut)):
            self._cache.move_to_end(key)
            return fut
        if self._executor is None:
            self._executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="grammar")
        job = self._jobs[key] = _Job()
        fut = job.future = self._executor.submit(self._run, key, job)
        self._cache[key] = fut
        self._evict()
        return fut

    def cancel(self, kind: str, text: str) -> None:
        """No request waits for this grammar any more: stop its compilation (out of the queue, or
        its trial killed) and forget it. One past its trial finishes, and stays cached."""
        key = (kind, text)
        job = self._jobs.get(key)
        if job is None or job.in_process or job.future.done():
            return
        del self._jobs[key]
        if not job.future.cancel():  # running: its trial is killed
            job.stop.set()
        if self._cache.get(key) is job.future:
            del self._cache[key]

    def expire(self) -> None:
        """Stop the trials that have run past the time limit: their requests fail with a 400."""
        now, limit = time.monotonic(), self.limits.timeout_s
        for key, job in list(self._jobs.items()):
            if job.future.done():
                del self._jobs[key]
            elif job.started is not None and not job.in_process and now - job.started > limit:
                kind = key[0]
                job.why = (f"the grammar did not compile within {limit:g}s (the server's limit, "
                           "RADIXSERVE_GRAMMAR_COMPILE_TIMEOUT_S); simplify it")
                job.stop.set()
                del self._jobs[key]
                if self._cache.get(key) is job.future:
                    del self._cache[key]  # a later request may try again
                logger.warning("grammar: a %s did not compile within %gs; stopped", kind, limit)

    @property
    def pending(self) -> bool:
        return bool(self._jobs)

    def _run(self, key: Key, job: _Job) -> Any:
        kind, text = key
        info = self._tokenizer_info()
        job.started = time.monotonic()
        if _CAN_FORK:
            if not try_compile(info, kind, text, self.limits.memory_mb, job.stop):
                raise GrammarError(kind, f"{kind}: {job.why}")
            job.in_process = True
            return compile_grammar(self._xgr, kind, text)
        job.in_process = True  # NOTE: no trial without fork: unbounded, as xgrammar itself is
        compiled = compile_grammar(self._xgr, kind, text)
        if (why := dead_end(compiled)) is not None:
            raise GrammarError(kind, f"{kind}: {why}")
        return compiled

    def _tokenizer_info(self) -> Any:
        with self._lock:
            if self._info is None:
                import xgrammar as xgr
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.model_path)
                # NOTE: the model's vocab (the logits' width) may exceed the tokenizer's
                info = xgr.TokenizerInfo.from_huggingface(
                    tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=sorted(self.stop_ids) or None)
                self._xgr = xgr.GrammarCompiler(info, cache_enabled=False)  # ours is the cache
                self._info = info
                logger.info("grammar: xgrammar ready for %s (%s vocabulary)", self.model_path.name,
                            info.vocab_type.name.lower())
            return self._info

    def _evict(self) -> None:
        """Oldest first, past `max_cached` grammars or `cache_mb` (the newest always stays)."""
        limit = self.limits.cache_mb << 20
        while len(self._cache) > self.max_cached or (
                len(self._cache) > 1 and sum(map(_size, self._cache.values())) > limit):
            self._cache.popitem(last=False)


def _size(fut: Future) -> int:
    """A compiled grammar's size in bytes (xgrammar's count); 0 until it is compiled."""
    if not fut.done() or fut.cancelled() or fut.exception() is not None:
        return 0
    return int(fut.result().memory_size_bytes)


def _internal_failure(fut: Future) -> bool:
    """A failure that is not the grammar's fault (e.g. the tokenizer did not load): retried."""
    if fut.cancelled():
        return True
    e = fut.exception()
    return e is not None and not isinstance(e, GrammarError)
