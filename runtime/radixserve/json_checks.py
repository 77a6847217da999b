"""Checks over decoded JSON that a request must pass before any work: nesting depth (Python's
recursive code — json, jsonschema, grammar compilers — would otherwise raise RecursionError),
valid Unicode text in every string value and dictionary key (a lone surrogate from a `\\ud800`
escape cannot be encoded as UTF-8, so it would fail only when a reply or a log line is written),
and size: every later step (validation, templates, schema checks) costs time per object, key and
list item, so a body of a million keys or of 300,000 messages is refused here, in milliseconds,
instead of holding the event loop for a minute.

The walk is iterative (it never recurses, whatever the input) and runs Python code only for
containers, keys and the items of lists that are not all numbers: a list of numbers (token ids) is
judged by a C loop, so a 32 MiB list of them takes a fraction of a second; they are limited only
in all (`MAX_JSON_NUMBERS`: validating them is what costs), a prompt's own length against its
context being a check that needs the model (`server/prompt_bound.py`)."""
from __future__ import annotations

import json
from typing import Any, NamedTuple

MAX_JSON_DEPTH = 64  # JSON schemas in the wild nest a dozen levels; 64 leaves room
MAX_OBJECT_KEYS = 4096  # in one object: logit_bias holds 1,024; a schema's properties a few hundred
MAX_LIST_ITEMS = 16384  # in one list holding anything but numbers (messages, strings, schemas)
MAX_JSON_ITEMS = 1 << 18  # objects, arrays, keys and non-number list items in one document
MAX_JSON_NUMBERS = 1 << 21  # in lists of numbers (token ids), in one document: 16 prompts of 128K


class JsonProblem(NamedTuple):
    path: str  # dotted, as error `param`s name fields: "metadata", "messages.0.content"
    message: str


def _valid_text(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _numbers(items: list) -> bool:
    """Whether the list holds numbers only (token ids), judged by a C loop: `sum` raises
    TypeError on anything else, and runs over 16M ints in a fifth of a second."""
    try:
        sum(items)
    except TypeError:
        return False
    return True


def _look(node: Any) -> bool:
    """Whether the walk must visit `node`: a container, or text that may hold a lone surrogate."""
    return isinstance(node, (dict, list)) or (isinstance(node, str) and not node.isascii())


def find_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> JsonProblem | None:
    """The first place where `value` (decoded JSON) nests deeper than `max_depth` containers,
    holds text that is not valid Unicode or is too large (an object of more than
    `MAX_OBJECT_KEYS` keys, a list of more than `MAX_LIST_ITEMS` items that are not all numbers,
    more than `MAX_JSON_ITEMS` in all, more than `MAX_JSON_NUMBERS` in lists of numbers); None
    when it has none of these."""
    stack: list[tuple[Any, tuple | None, int]] = [(value, None, 0)]  # (node, where, depth)
    items = numbers = 0
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, str):
            if not _valid_text(node):
                return JsonProblem(_dotted(where), "must be valid Unicode text (it contains a lone surrogate)")
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth >= max_depth:
            return JsonProblem(_dotted(where), f"nests deeper than {max_depth} levels")
        items += 1
        if isinstance(node, dict):
            if len(node) > MAX_OBJECT_KEYS:
                return JsonProblem(_dotted(where), f"has {len(node)} keys, more than the {MAX_OBJECT_KEYS} "
                                                   "an object may have")
            items += len(node)
            for k, v in node.items():
                if isinstance(k, str) and not _valid_text(k):
                    return JsonProblem(_dotted(where), "has a key that is not valid Unicode text "
                                                       "(it contains a lone surrogate)")
                if _look(v):
                    stack.append((v, (where, k), depth + 1))
        elif _numbers(node):
            numbers += len(node)
            if numbers > MAX_JSON_NUMBERS:
                return JsonProblem("", f"holds more than {MAX_JSON_NUMBERS} numbers in lists (token ids)")
        else:
            if len(node) > MAX_LIST_ITEMS:
                return JsonProblem(_dotted(where), f"has {len(node)} items, more than the {MAX_LIST_ITEMS} "
                                                   "a list of anything but numbers may have")
            items += len(node)
            stack.extend((v, (where, i), depth + 1) for i, v in enumerate(node) if _look(v))
        if items > MAX_JSON_ITEMS:
            return JsonProblem("", f"holds more than {MAX_JSON_ITEMS} objects, lists, keys and list "
                                   "items that are not numbers")
    return None


def _dotted(where: tuple | None, part_chars: int = 40, chars: int = 120) -> str:
    """The path (a chain of (parent, key) pairs) as a short text: a client's keys can be long, a
    deep path longer."""
    parts = []
    while where is not None:
        where, key = where
        parts.append(str(key))
    text = ".".join(p if len(p) <= part_chars else p[:part_chars] + "…" for p in reversed(parts))
    return text if len(text) <= chars else text[:chars] + "…"


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads`, with ValueError (never RecursionError) for input nested deeper than
    `max_depth`, holding invalid text or too large (`find_problem`)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nests deeper than {max_depth} levels") from None
    problem = find_problem(value, max_depth)
    if problem is not None:
        raise ValueError(f"{problem.path + ' ' if problem.path else ''}{problem.message}")
    return value
