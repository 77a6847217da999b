"""`tools`, `tool_choice` and `parallel_tool_calls` → a `ToolPlan`: the tools the chat template
gets (as transformers takes them), the grammar that forces a call (`required`: one of the
functions, as vLLM builds it; a named function: its parameter schema) and the parser that turns
each choice's text into content and `tool_calls`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixserve.postprocess.auto_tool_parsers import AUTO_PARSERS
from radixserve.postprocess.chat_output import ChatOutput
from radixserve.postprocess.reasoning import ReasoningParser
from radixserve.postprocess.tool_parsers import (
    NamedCallParser,
    PlainParser,
    RequiredCallsParser,
    ToolParser,
)
from radixserve.server.errors import APIError, short
from radixserve.server.protocol import ChatCompletionRequest, FunctionDefinition, Tool
from radixserve.server.structured_output import MAX_SCHEMA_NODES, Constraint, check_json_schema

NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # none | auto | required | named
    tools_json: str | None = None  # the tools for the chat template, as JSON text
    constraint: Constraint | None = None  # required / named: the grammar forcing the call
    function: str | None = None  # named: the function called
    parser: str | None = None  # auto: the model's own tool-call format (None: never parsed)
    parallel: bool = True
    reasoning: str | None = None  # the server's reasoning parser for this request (postprocess/reasoning.py)

    @property
    def forced(self) -> bool:
        return self.constraint is not None

    def new_parser(self) -> ToolParser:
        """A fresh parser for one choice."""
        if self.mode == "required":
            return RequiredCallsParser()
        if self.mode == "named":
            assert self.function is not None
            return NamedCallParser(self.function)
        if self.mode == "auto" and self.parser is not None:
            return AUTO_PARSERS[self.parser](self.parallel)
        return PlainParser()

    def new_output(self) -> ChatOutput:
        """A fresh output state for one choice: its reasoning split, then its tool calls."""
        reasoning = ReasoningParser(self.reasoning) if self.reasoning is not None else None
        return ChatOutput(self.new_parser(), reasoning)


def parameters(f: FunctionDefinition) -> dict:
    return NO_PARAMETERS if f.parameters is None else f.parameters


# keywords whose values are data, not schemas: a `$ref` key inside them is not a reference
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def rebase_refs(schema: Any, base: str) -> Any:
    """`schema` moved to the JSON pointer `base` of a larger document: each local reference
    (`#`, `#/$defs/Point`, `#/properties/a`) now points under `base`. Anchors and remote
    references are kept."""
    if isinstance(schema, list):
        return [rebase_refs(s, base) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
            out[k] = base + v[1:]
        elif k in _DATA_KEYWORDS:
            out[k] = v
        else:
            out[k] = rebase_refs(v, base)
    return out


def required_calls_schema(tools: list[Tool], parallel: bool) -> dict:
    """An array of `{"name": <one of the functions>, "parameters": <its schema>}`, at least one
    (exactly one without `parallel_tool_calls`). NOTE: each function's schema sits in the
    document's `$defs`, its local references rebased there, so a `$ref` to its own `$defs` (as
    pydantic writes nested models) still resolves once nested under the array."""
    defs = {f"tool_{i}": rebase_refs(parameters(t.function), f"#/$defs/tool_{i}") for i, t in enumerate(tools)}
    calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t.function.name]},
                                               "parameters": {"$ref": f"#/$defs/tool_{i}"}},
              "required": ["name", "parameters"], "additionalProperties": False} for i, t in enumerate(tools)]
    schema: dict = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}, "minItems": 1,
                    "$defs": defs}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _json_grammar(schema: dict, field: str) -> Constraint:
    """Of schemas already checked."""
    return Constraint("json_schema", json.dumps(schema, ensure_ascii=False), field)


def plan_tools(req: ChatCompletionRequest, parser: str | None) -> ToolPlan:
    """A 400 naming the field for a choice that cannot be honoured. CPU work (every schema is
    checked): call it off the event loop."""
    tools, choice = req.tools or [], req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools:
        if choice in ("none", "auto"):
            return ToolPlan("none")
        raise APIError(400, "tool_choice requires tools", "tool_choice")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools must have distinct function names", "tools")
    nodes_left = MAX_SCHEMA_NODES  # (shared by the tools: one request's schemas, checked together)
    for i, t in enumerate(tools):  # every schema, not only the one forced: the template shows them all
        if t.function.parameters is not None:
            nodes_left = check_json_schema(t.function.parameters, f"tools.{i}.function.parameters", nodes_left)
    tools_json = json.dumps([t.model_dump(exclude_none=True, by_alias=True) for t in tools], ensure_ascii=False)
    if choice in ("none", "auto"):
        return ToolPlan(choice, tools_json, parser=parser, parallel=req.parallel_tool_calls)
    if choice == "required":
        grammar = _json_grammar(required_calls_schema(tools, req.parallel_tool_calls), "tools")
        return ToolPlan("required", tools_json, grammar, parallel=req.parallel_tool_calls)
    name = choice.function.name
    if name not in names:
        raise APIError(400, f"tool_choice names the function {short(name)}, which is not in tools",
                       "tool_choice.function.name")
    i = names.index(name)
    grammar = _json_grammar(parameters(tools[i].function), f"tools.{i}.function.parameters")
    return ToolPlan("named", tools_json, grammar, function=name, parallel=False)
