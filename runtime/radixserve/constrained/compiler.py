"""Grammar compilation with xgrammar on a thread pool, off the scheduler's critical path, with the
last results kept by (kind, text) so the n choices of one request and repeated schemas compile once.

The tokenizer (for xgrammar's `TokenizerInfo`) and xgrammar itself are loaded by the first
compilation, in a worker thread: a server that never sees a constrained request pays nothing.

Whitespace: JSON schemas compile with `any_whitespace=False`, so the output is one line with
xgrammar's fixed separators (", " and ": "). A model cannot then spend its tokens on whitespace
between values (a small or random model given free whitespace may never finish the object)."""
from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAX_CACHED = 256  # compiled grammars kept (least recently used evicted)
_WORKERS = 2
_XGR_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: |Check failed: \(.*?\) is false: ")


class GrammarError(ValueError):
    """The grammar given in SamplingParams field `param` does not compile: the client's fault."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def describe_error(param: str, e: Exception) -> str:
    """xgrammar's error without its C++ source location: `<param>: <why>`."""
    why = _XGR_NOISE.sub("", str(e).strip()).strip()
    return f"{param}: could not compile the grammar: {why}"


class GrammarCompiler:
    def __init__(self, model_path: Path, vocab_size: int, stop_ids: set[int],
                 max_cached: int = MAX_CACHED) -> None:
        self.model_path, self.vocab_size, self.stop_ids = model_path, vocab_size, stop_ids
        self.max_cached = max_cached
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()  # scheduler thread only
        self._executor: ThreadPoolExecutor | None = None
        self._xgr: Any = None  # xgrammar.GrammarCompiler, built by the first compilation
        self._lock = threading.Lock()

    def compile(self, kind: str, text: str) -> Future:
        """A future of the `xgrammar.CompiledGrammar` for `kind` (a SamplingParams grammar field)
        and `text`; it raises `GrammarError` if the grammar is invalid."""
        key = (kind, text)
        fut = self._cache.get(key)
        if fut is not None and not (fut.done() and _internal_failure(fut)):
            self._cache.move_to_end(key)
            return fut
        if self._executor is None:
            self._executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="grammar")
        fut = self._cache[key] = self._executor.submit(self._compile, kind, text)
        self._cache.move_to_end(key)
        if len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return fut

    def _compile(self, kind: str, text: str) -> Any:
        compiler = self._compiler()
        try:
            if kind == "json_schema":
                return compiler.compile_json_schema(text, any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(text)
            if kind == "ebnf":
                return compiler.compile_grammar(text, root_rule_name="root")
        except (RuntimeError, ValueError) as e:  # how xgrammar reports a bad grammar
            raise GrammarError(kind, describe_error(kind, e)) from None
        raise AssertionError(f"unknown grammar kind {kind!r}")

    def _compiler(self) -> Any:
        with self._lock:
            if self._xgr is None:
                import xgrammar as xgr
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.model_path)
                # NOTE: the model's vocab (the logits' width) may exceed the tokenizer's
                info = xgr.TokenizerInfo.from_huggingface(
                    tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=sorted(self.stop_ids) or None)
                self._xgr = xgr.GrammarCompiler(info, cache_enabled=False)  # ours is the cache
                logger.info("grammar: xgrammar ready for %s (%s vocabulary)", self.model_path.name,
                            info.vocab_type.name.lower())
            return self._xgr


def _internal_failure(fut: Future) -> bool:
    """A failure that is not the grammar's fault (e.g. the tokenizer did not load): retried."""
    e = fut.exception()
    return e is not None and not isinstance(e, GrammarError)
