"""Checks over decoded JSON that a request must pass before any work: nesting depth (Python's
recursive code — json, jsonschema, grammar compilers — would otherwise raise RecursionError) and
valid Unicode text in every string value and dictionary key (a lone surrogate from a `\\ud800`
escape cannot be encoded as UTF-8, so it would fail only when a reply or a log line is written).
Both walks are iterative: they never recurse, whatever the input."""
from __future__ import annotations

import json
from typing import Any, NamedTuple

MAX_JSON_DEPTH = 64  # JSON schemas in the wild nest a dozen levels; 64 leaves room


class JsonProblem(NamedTuple):
    path: str  # dotted, as error `param`s name fields: "metadata", "messages.0.content"
    message: str


def _valid_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def find_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> JsonProblem | None:
    """The first place where `value` (decoded JSON) nests deeper than `max_depth` containers or
    holds text that is not valid Unicode; None when it has neither."""
    stack: list[tuple[Any, tuple, int]] = [(value, (), 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            if not _valid_text(node):
                return JsonProblem(_dotted(path), "must be valid Unicode text (it contains a lone surrogate)")
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth >= max_depth:
            return JsonProblem(_dotted(path), f"nests deeper than {max_depth} levels")
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(k, str) and not _valid_text(k):
                    return JsonProblem(_dotted(path), "has a key that is not valid Unicode text "
                                                      "(it contains a lone surrogate)")
                stack.append((v, (*path, k), depth + 1))
        else:
            stack.extend((v, (*path, i), depth + 1) for i, v in enumerate(node))
    return None


def _dotted(path: tuple, part_chars: int = 40, chars: int = 120) -> str:
    """The path as a short text: a client's keys can be long, a deep path longer."""
    text = ".".join(str(p) if len(str(p)) <= part_chars else str(p)[:part_chars] + "…" for p in path)
    return text if len(text) <= chars else text[:chars] + "…"


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads`, with ValueError (never RecursionError) for input nested deeper than
    `max_depth` or holding invalid text."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nests deeper than {max_depth} levels") from None
    problem = find_problem(value, max_depth)
    if problem is not None:
        raise ValueError(f"{problem.path + ' ' if problem.path else ''}{problem.message}")
    return value
