"""Structured output: a request's `response_format`, `regex` or `ebnf` (SGLang's fields) become the
one grammar the engine enforces (`SamplingParams.json_schema | regex | ebnf`). What can be checked
here is checked before anything is queued: one constraint at most, a schema valid against its
metaschema; what only the grammar compiler can judge comes back from the scheduler as a 400 whose
`param` `Constraint.names` maps to the field the client sent."""
from __future__ import annotations

import functools
import json
from typing import Any, NamedTuple

from radixserve.server.errors import APIError
from radixserve.server.protocol import ConstraintFields

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


def request_constraint(req: ConstraintFields) -> Constraint | None:
    """The grammar a request asks for, or None; a 400 for two at once or an invalid schema."""
    rf = req.response_format
    given = [name for name, on in (("response_format", rf is not None and rf.type != "text"),
                                   ("regex", req.regex is not None), ("ebnf", req.ebnf is not None)) if on]
    if len(given) > 1:
        raise APIError(400, f"{given[1]} cannot be combined with {given[0]}: give at most one of "
                       "response_format, regex and ebnf", given[1])
    if req.regex is not None:
        return Constraint("regex", req.regex, "regex")
    if req.ebnf is not None:
        return Constraint("ebnf", req.ebnf, "ebnf")
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return Constraint("json_schema", json.dumps(ANY_JSON_OBJECT), "response_format")
    if rf.json_schema is None:
        raise APIError(400, "response_format.json_schema is required when its type is json_schema",
                       "response_format.json_schema")
    schema = rf.json_schema.schema_
    return schema_constraint(ANY_JSON_OBJECT if schema is None else schema, "response_format.json_schema.schema")
