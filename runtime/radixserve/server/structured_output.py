"""Structured output: a request's `response_format`, SGLang's `regex`, `ebnf` or `json_schema`, or
vLLM's `structured_outputs` (or its older `guided_json | guided_regex | guided_choice |
guided_grammar`) become the one grammar the engine enforces (`SamplingParams.json_schema | regex |
ebnf`; a `choice` is EBNF alternatives). What can be checked here is checked before anything is
queued: one constraint at most, a schema valid against its metaschema; what only the grammar
compiler can judge comes back from the scheduler as a 400 whose `param` `Constraint.names` maps
to the field the client sent."""
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from radixserve.json_checks import loads_bounded
from radixserve.server.errors import APIError
from radixserve.server.protocol import ConstraintFields, ResponseFormat

ANY_JSON_OBJECT = {"type": "object"}  # `json_object`, and `json_schema` without a schema
MAX_SCHEMA_NODES = 16384  # objects and arrays in a request's JSON schemas, tools' included
_MESSAGE_CHARS = 200


class Constraint(NamedTuple):
    kind: str  # the engine's field: json_schema | regex | ebnf
    value: str  # the schema as JSON text, or the grammar
    field: str  # the request's field, named in errors

    @property
    def names(self) -> dict[str, str]:
        """The engine's field → the client's, for the `param` of a compile failure."""
        return {self.kind: self.field}


def schema_nodes(schema: Any) -> int:
    """The objects and arrays in `schema`: what checking and compiling it cost grows with."""
    count, stack = 0, [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            count += 1
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            count += 1
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return count


@functools.cache
def _metaschema_validator(uri: str | None) -> Any:
    """A validator of the metaschema `$schema` names (draft 2020-12 for none or an unknown one, as
    `jsonschema` picks): built from the metaschema itself, so that an unknown `$schema` is never
    fetched from the network."""
    import jsonschema_rs
    from jsonschema import validators

    cls = validators.validator_for({"$schema": uri} if uri else {}, default=validators.Draft202012Validator)
    return jsonschema_rs.validator_for(cls.META_SCHEMA)


def check_json_schema(schema: Any, field: str, nodes_left: int = MAX_SCHEMA_NODES) -> int:
    """A 400 naming `field` unless `schema` is a JSON Schema (checked against its metaschema:
    draft 2020-12 unless its `$schema` names another) of at most `nodes_left` objects and arrays;
    the nodes left after it (a request's schemas share `MAX_SCHEMA_NODES`). CPU work: call it off
    the event loop."""
    if not isinstance(schema, dict):
        raise APIError(400, f"{field} must be a JSON object", field)
    nodes = schema_nodes(schema)
    if nodes > nodes_left:
        raise APIError(400, f"{field} is too large: the request's JSON schemas may hold {MAX_SCHEMA_NODES} "
                            "objects and arrays in all", field)
    uri = schema.get("$schema")
    error = next(iter(_metaschema_validator(uri if isinstance(uri, str) else None).iter_errors(schema)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.instance_path)
        why = error.message if len(error.message) <= _MESSAGE_CHARS else error.message[:_MESSAGE_CHARS] + "…"
        raise APIError(400, f"{field} is not a valid JSON schema{f' at /{where}' if where else ''}: {why}",
                       field)
    return nodes_left - nodes


def schema_constraint(schema: dict, field: str) -> Constraint:
    check_json_schema(schema, field)
    return Constraint("json_schema", json.dumps(schema, ensure_ascii=False), field)


def _schema(value: dict | str, field: str) -> Constraint:
    """A JSON schema given as an object or as its JSON text (SGLang's `json_schema`, vLLM's)."""
    if isinstance(value, str):
        try:
            value = loads_bounded(value)
        except ValueError as e:
            raise APIError(400, f"{field} must be a JSON schema as JSON text: {e}", field) from None
    return schema_constraint(value, field)


def choice_grammar(choices: list[str], field: str) -> Constraint:
    """vLLM's `choice`: exactly one of the strings, as EBNF alternatives of JSON-quoted literals
    (xgrammar reads JSON's escapes in a literal)."""
    return Constraint("ebnf", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices), field)


Build = Callable[[Any, str], Constraint]  # (the field's value, its name) → the grammar


def _literal(kind: str) -> Build:
    return lambda value, field: Constraint(kind, value, field)


def _any_object(_: Any, field: str) -> Constraint:
    return Constraint("json_schema", json.dumps(ANY_JSON_OBJECT), field)


def _given(req: ConstraintFields) -> list[tuple[str, Any, Build]]:
    """Each constraint field the request set: its name as the client used it, value, grammar."""
    rf, so = req.response_format, req.structured_outputs
    fields: list[tuple[str, Any, Build]] = [
        ("response_format", rf if rf is not None and rf.type != "text" else None, _response_format),
        ("regex", req.regex, _literal("regex")),
        ("ebnf", req.ebnf, _literal("ebnf")),
        ("json_schema", req.json_schema, _schema),
        ("guided_json", req.guided_json, _schema),
        ("guided_regex", req.guided_regex, _literal("regex")),
        ("guided_choice", req.guided_choice, choice_grammar),
        ("guided_grammar", req.guided_grammar, _literal("ebnf")),
    ]
    if so is not None:
        fields += [("structured_outputs.json", so.json_, _schema),
                   ("structured_outputs.regex", so.regex, _literal("regex")),
                   ("structured_outputs.choice", so.choice, choice_grammar),
                   ("structured_outputs.grammar", so.grammar, _literal("ebnf")),
                   ("structured_outputs.json_object", so.json_object or None, _any_object)]
    return [f for f in fields if f[1] is not None]


def _response_format(rf: ResponseFormat, field: str) -> Constraint:
    if rf.type == "json_object":
        return Constraint("json_schema", json.dumps(ANY_JSON_OBJECT), field)
    if rf.json_schema is None:
        raise APIError(400, "response_format.json_schema is required when its type is json_schema",
                       "response_format.json_schema")
    schema = rf.json_schema.schema_
    return schema_constraint(ANY_JSON_OBJECT if schema is None else schema, "response_format.json_schema.schema")


def request_constraint(req: ConstraintFields) -> Constraint | None:
    """The grammar a request asks for, or None; a 400 for two at once or an invalid schema."""
    given = _given(req)
    if len(given) > 1:
        raise APIError(400, f"{given[1][0]} cannot be combined with {given[0][0]}: give at most one "
                       "constraint (response_format, regex, ebnf, json_schema, structured_outputs, guided_*)",
                       given[1][0])
    if not given:
        return None
    name, value, build = given[0]
    return build(value, name)
