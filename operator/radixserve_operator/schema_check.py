"""The OpenAPI part of the CRD's schema (types, enums, bounds, lengths, patterns, item counts),
checked by the operator over a defaulted spec, as the API server checks it at admission.

Why the operator checks it too: an operator may run under an older CRD (Helm never upgrades a
chart's crds/) that lacks a newer bound, and a resource parsed outside an API server met none.
One walk over the schema the CRD is generated from, so no bound is written twice. A field the
schema does not declare is not judged (the API server prunes it); free-form objects are not
walked. Lengths are checked before patterns, so no pattern ever runs on an unbounded string."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from radixserve_operator.crd import QUANTITY_PATTERN
from radixserve_operator.quantity import QuantityError, parse_quantity


@functools.cache
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def _type_problem(node: dict[str, Any], value: Any) -> str | None:
    if node.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return None if ok else "must be an integer or a string"
    want = node.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    }
    if want in checks and not checks[want](value):
        return f"must be of type {want}"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    return None


def _number_problem(node: dict[str, Any], value: float) -> str | None:
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and (value <= low if node.get("exclusiveMinimum") else value < low):
        return f"must be {'above' if node.get('exclusiveMinimum') else 'at least'} {low}"
    if high is not None and value > high:
        return f"must be at most {high}"
    return None


def _string_problem(node: dict[str, Any], value: str) -> str | None:
    if "maxLength" in node and len(value) > node["maxLength"]:
        return f"at most {node['maxLength']} characters, got {len(value)}"
    if len(value) < node.get("minLength", 0):
        return f"at least {node['minLength']} character(s)"
    pattern = node.get("pattern")
    if pattern and not _pattern(pattern).search(value):
        return f"must match {pattern}, got {value[:64]!r}"
    if pattern == QUANTITY_PATTERN:
        try:
            parse_quantity(value, node.get("maximum", math.inf))
        except QuantityError as e:
            return str(e)
    return None


def _problem(node: dict[str, Any], value: Any) -> str | None:
    problem = _type_problem(node, value)
    if problem:
        return problem
    if "enum" in node and value not in node["enum"]:
        got = repr(value[:64] if isinstance(value, str) else value)
        return f"must be one of {', '.join(map(str, node['enum']))}, got {got}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number_problem(node, value)
    if isinstance(value, str):
        return _string_problem(node, value)
    if isinstance(value, list):
        if "maxItems" in node and len(value) > node["maxItems"]:
            return f"at most {node['maxItems']} items, got {len(value)}"
        if len(value) < node.get("minItems", 0):
            return f"at least {node['minItems']} item(s)"
    if isinstance(value, dict) and len(value) > node.get("maxProperties", len(value)):
        return f"at most {node['maxProperties']} entries, got {len(value)}"
    return None


def schema_problems(value: Any, node: dict[str, Any], path: str = "spec") -> list[str]:
    """"PATH: what is wrong" for each value under `node` (a CRD schema node) that breaks it."""
    if value is None:
        return []  # the API server prunes nulls; absence is the CEL rules' and required's to judge
    problem = _problem(node, value)
    if problem:
        return [f"{path}: {problem}"]
    out: list[str] = []
    if isinstance(value, dict):
        props, extra = node.get("properties") or {}, node.get("additionalProperties")
        for key in node.get("required") or ():
            if value.get(key) is None:
                out.append(f"{path}.{key}: required")
        for key, sub in value.items():
            child = props.get(key) or (extra if isinstance(extra, dict) else None)
            if child is not None:
                out += schema_problems(sub, child, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            out += schema_problems(item, node["items"], f"{path}[{i}]")
    return out
