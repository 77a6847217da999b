"""xgrammar's calls for one grammar: compile it, and find out whether it admits any output.

Whitespace: JSON schemas compile with `any_whitespace=False`, so the output is one line with
xgrammar's fixed separators (", " and ": "). A model cannot then spend its tokens on whitespace
between values (a small or random model given free whitespace may never finish the object)."""
from __future__ import annotations

import re
from typing import Any

_XGR_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: |Check failed: \(.*?\) is false: ")
_FORCED_STEPS = 64  # forced stretches followed by `dead_end` (each one at least a character)


class GrammarError(ValueError):
    """The grammar given in SamplingParams field `param` cannot be used: the client's fault."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def describe_error(param: str, e: Exception) -> str:
    """xgrammar's error without its C++ source location: `<param>: <why>`."""
    why = _XGR_NOISE.sub("", str(e).strip()).strip()
    return f"{param}: could not compile the grammar: {why}"


def compile_grammar(compiler: Any, kind: str, text: str) -> Any:
    """The `xgrammar.CompiledGrammar` of `text` (a SamplingParams grammar field `kind`);
    GrammarError if xgrammar refuses it, MemoryError if it ran out of memory."""
    try:
        if kind == "json_schema":
            return compiler.compile_json_schema(text, any_whitespace=False)
        if kind == "regex":
            return compiler.compile_regex(text)
        if kind == "ebnf":
            return compiler.compile_grammar(text, root_rule_name="root")
    except (RuntimeError, ValueError) as e:  # how xgrammar reports a bad grammar
        if "bad_alloc" in str(e):  # C++'s out-of-memory, as xgrammar passes it on
            raise MemoryError(str(e)) from None
        raise GrammarError(kind, describe_error(kind, e)) from None
    raise AssertionError(f"unknown grammar kind {kind!r}")


def dead_end(compiled: Any) -> str | None:
    """Why no output can ever satisfy the grammar, or None when the model has a choice to make.

    A grammar that allows no first token (`root ::= root`, an empty character class, text the
    vocabulary cannot spell) is caught at once; so is one whose forced start (text that is the
    only way on, as the `"` opening a JSON string) leads to such a place. Past the first real
    choice this cannot tell: the scheduler fails a request that reaches a dead end later."""
    import numpy as np
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiled)
    mask = np.zeros(xgr.get_bitmask_shape(1, compiled.tokenizer_info.vocab_size), dtype=np.int32)
    forced = ""
    for _ in range(_FORCED_STEPS):
        matcher.fill_next_token_bitmask(mask)
        if not mask.any():
            after = f" after the text it forces ({forced[:40]!r})" if forced else ""
            return f"the grammar admits no output: no token of the model's vocabulary can come next{after}"
        step = matcher.find_jump_forward_string()
        if not step or not matcher.accept_string(step):
            return None
        forced += step
    return None
