"""A seeded corpus of hostile requests, grown with every finding of a hostile probe: each must get
a 4xx (or a correct 2xx), never a 5xx, and the server must serve on afterwards.

`CORPUS` holds the requests written by hand; `mutations` derives more from valid bodies with a
seeded generator (a lone surrogate in a random key or value, deep nesting, huge integers, wrong
types), the same ones in every run."""
from __future__ import annotations

import json
import random
from typing import Any, NamedTuple

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
RESPONSE = {"model": "tiny", "input": "hi", "max_output_tokens": 2}
GENERATE = {"text": "hi", "sampling_params": {"max_tokens": 2}}
TOKENIZE = {"model": "tiny", "prompt": "hi"}
EMBED = {"model": "tiny", "input": "hi"}
VALID = [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION), ("/v1/responses", RESPONSE),
         ("/generate", GENERATE), ("/tokenize", TOKENIZE), ("/v1/embeddings", EMBED)]


class Hostile(NamedTuple):
    name: str
    path: str
    body: bytes
    content_type: str = "application/json"


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()  # a lone surrogate goes out as the escape `\ud800`


def deep_json(depth: int, leaf: str = "{}") -> str:
    """An object nested `depth` levels, as text (json.dumps would recurse as deep)."""
    return '{"a": ' * depth + leaf + "}" * depth


def deep_schema(depth: int) -> str:
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


CORPUS = [
    # text that is not valid Unicode, in a key as well as a value
    Hostile("surrogate metadata key", "/v1/responses", _json(RESPONSE | {"metadata": {"\ud800": "x"}})),
    Hostile("surrogate metadata value", "/v1/responses", _json(RESPONSE | {"metadata": {"k": "\udfff"}})),
    Hostile("surrogate template kwarg key", "/v1/chat/completions",
            _json(CHAT | {"chat_template_kwargs": {"\ud800": True}})),
    Hostile("surrogate logit_bias key", "/v1/completions", _json(COMPLETION | {"logit_bias": {"\ud800": 1}})),
    Hostile("surrogate schema key", "/v1/chat/completions", _json(CHAT | {"response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": {"properties": {"\udc00": {}}}}}})),
    Hostile("surrogate unknown field", "/v1/chat/completions", _json(CHAT | {"\ud800extra": 1})),
    Hostile("surrogate tool parameters", "/v1/chat/completions", _json(CHAT | {"tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "description": "\ud800"}}}]})),
    Hostile("invalid utf-8 bytes", "/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 2}'),
    # nesting
    Hostile("3000-deep json_schema text", "/generate",
            _json({"text": "hi", "sampling_params": {"max_tokens": 2, "json_schema": deep_schema(3000)}})),
    Hostile("200-deep json_schema text", "/generate",
            _json({"text": "hi", "sampling_params": {"max_tokens": 2, "json_schema": deep_schema(200)}})),
    Hostile("3000-deep body", "/v1/chat/completions",
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x": ' + deep_json(3000).encode() + b"}"),
    Hostile("3000-deep metadata", "/v1/responses",
            b'{"input": "hi", "max_output_tokens": 2, "metadata": ' + deep_json(3000).encode() + b"}"),
    Hostile("3000-deep response_format schema", "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "response_format": '
            b'{"type": "json_schema", "json_schema": {"name": "a", "schema": ' + deep_schema(3000).encode() + b"}}}"),
    Hostile("3000-deep array", "/v1/completions", b"[" * 3000 + b"]" * 3000),
    Hostile("100-deep tool parameters", "/v1/chat/completions", _json(CHAT | {"tools": [
        {"type": "function", "function": {"name": "f", "parameters": json.loads(deep_schema(100))}}]})),
    # a prompt too long for the context, far past it
    Hostile("long completion prompt", "/v1/completions", _json(COMPLETION | {"prompt": "a" * 200_000})),
    Hostile("long chat content", "/v1/chat/completions",
            _json(CHAT | {"messages": [{"role": "user", "content": "ab " * 70_000}]})),
    Hostile("long responses input", "/v1/responses", _json(RESPONSE | {"input": "a" * 200_000})),
    Hostile("long generate text", "/generate", _json({"text": "a" * 200_000})),
    Hostile("long tokenize prompt", "/tokenize", _json(TOKENIZE | {"prompt": "a" * 200_000})),
    Hostile("long embedding input", "/v1/embeddings", _json(EMBED | {"input": "a" * 200_000})),
    Hostile("long prompt, truncated", "/v1/completions",
            _json(COMPLETION | {"prompt": "a" * 200_000, "truncate_prompt_tokens": 4})),
    # fields a handler validates itself
    Hostile("responses extra of the wrong type", "/v1/responses", _json(RESPONSE | {"top_k": "many"})),
    Hostile("responses extra out of range", "/v1/responses", _json(RESPONSE | {"seed": -5})),
    Hostile("responses stop of the wrong type", "/v1/responses", _json(RESPONSE | {"stop": {"a": 1}})),
    Hostile("generate json_schema not JSON", "/generate",
            _json({"text": "hi", "sampling_params": {"max_tokens": 2, "json_schema": "{"}})),
    Hostile("chat template kwargs deep", "/v1/chat/completions",
            _json(CHAT | {"chat_template_kwargs": json.loads(deep_json(60))})),
    # grammars that admit no output, or die after a choice, and schemas past the size limit
    Hostile("ebnf admits nothing", "/v1/completions", _json(COMPLETION | {"ebnf": "root ::= root"})),
    Hostile("ebnf admits nothing, sampled", "/v1/completions",
            _json(COMPLETION | {"ebnf": "root ::= a\na ::= b\nb ::= a", "temperature": 1.0})),
    Hostile("regex of an empty class", "/v1/completions", _json(COMPLETION | {"regex": r"[^\s\S]"})),
    Hostile("pattern no string matches", "/v1/chat/completions", _json(CHAT | {"temperature": 1.0, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "pattern": r"[^\s\S]"}}}})),
    Hostile("dead end after a choice", "/v1/completions",
            _json(COMPLETION | {"max_tokens": 4, "ebnf": 'root ::= ("a" | "b") x\nx ::= [^\\0-\\U0010ffff]'})),
    Hostile("dead end after a choice, streamed", "/v1/completions", _json(COMPLETION | {
        "max_tokens": 4, "stream": True, "temperature": 1.0, "ebnf": 'root ::= ("a" | "b") x\nx ::= [^\\0-\\U0010ffff]'})),
    Hostile("forced call of dead parameters", "/v1/chat/completions", _json(CHAT | {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": r"[^\s\S]"}},
            "required": ["a"], "additionalProperties": False}}}], "tool_choice": "required"})),
    Hostile("empty enum", "/generate", _json({"text": "hi", "sampling_params": {"max_tokens": 2, "json_schema": '{"enum": []}'}})),
    Hostile("min above max", "/v1/chat/completions", _json(CHAT | {"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "integer", "minimum": 10, "maximum": 1}}}})),
    Hostile("schema of 20,000 nodes", "/v1/chat/completions", _json(CHAT | {"response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "properties": {
            f"p{i}": {"type": "array", "items": {"type": "object"}} for i in range(4000)},
            "$defs": {f"d{i}": {"type": "array", "items": {"type": "object"}} for i in range(4000)},
            "anyOf": [{"type": "object"} for _ in range(4000)]}}}})),
    Hostile("unknown metaschema URL", "/v1/chat/completions", _json(CHAT | {"response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": {"$schema": "http://192.0.2.1/s", "type": "object"}}}})),
    # sizes every later step pays for, and fields of the chat template past the context
    Hostile("5,000 keys", "/v1/completions", _json(COMPLETION | {"logit_bias": {str(i): 1 for i in range(5000)}})),
    Hostile("20,000 stop strings", "/v1/completions", _json(COMPLETION | {"stop": ["x"] * 20_000})),
    Hostile("20,000 prompts", "/v1/completions", _json(COMPLETION | {"prompt": ["hi"] * 20_000})),
    Hostile("3 million token ids", "/v1/embeddings", _json(EMBED | {"input": [[5] * 1_000_000] * 3})),
    Hostile("20,000 empty messages", "/v1/chat/completions",
            _json(CHAT | {"messages": [{"role": "user", "content": ""}] * 20_000})),
    Hostile("2,000 empty messages", "/tokenize", _json({"messages": [{"role": "user", "content": ""}] * 2000})),
    Hostile("token ids past the context", "/generate", _json({"input_ids": [5] * 5000})),
    Hostile("long name", "/v1/chat/completions", _json(CHAT | {"messages": [{"role": "user", "content": "hi",
                                                                              "name": "n" * 60_000}]})),
    Hostile("long tool description", "/v1/chat/completions", _json(CHAT | {"tools": [
        {"type": "function", "function": {"name": "f", "description": "d" * 60_000}}]})),
    Hostile("long template variable", "/v1/chat/completions", _json(CHAT | {"chat_template_kwargs": {"x": "v" * 60_000}})),
    Hostile("responses of 20,000 items", "/v1/responses", _json(RESPONSE | {
        "input": [{"role": "user", "content": "hi"}] * 20_000})),
    Hostile("deep tool call arguments", "/v1/chat/completions", _json(CHAT | {"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 3000 + "]" * 3000}}]},
        {"role": "tool", "tool_call_id": "c", "content": "x"}]})),
    Hostile("embedding of the whole context", "/v1/embeddings", _json(EMBED | {"input": [[5] * 1024]})),
    # earlier findings, kept
    Hostile("huge max_tokens", "/v1/completions", _json(COMPLETION | {"max_tokens": 2**64})),
    Hostile("NaN temperature", "/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}'),
    Hostile("form body", "/v1/chat/completions", b"model=tiny", "application/x-www-form-urlencoded"),
    Hostile("truncated JSON", "/v1/chat/completions", b'{"messages": ['),
    Hostile("empty body", "/generate", b""),
]


def _mutate(value: Any, rng: random.Random) -> Any:
    """`value` (a copy) with one hostile change at a random place."""
    value = json.loads(json.dumps(value))
    node, places = value, []
    while isinstance(node, (dict, list)) and node:
        places.append(node)
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        if not isinstance(node[key], (dict, list)) or rng.random() < 0.4:
            break
        node = node[key]
    target = places[-1]
    key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
    kind = rng.choice(["surrogate value", "surrogate key", "deep", "huge int", "wrong type", "null"])
    if kind == "surrogate key" and isinstance(target, dict):
        target["\ud800" + str(key)] = target.pop(key)
    elif kind == "surrogate value":
        target[key] = "x\udbff"
    elif kind == "deep":
        target[key] = json.loads(deep_json(rng.choice([70, 500])))
    elif kind == "huge int":
        target[key] = rng.choice([2**64, -(2**63) - 1, 10**30])
    elif kind == "wrong type":
        target[key] = rng.choice([[], {}, "x", 1.5, True])
    elif key not in ("max_tokens", "max_output_tokens"):  # null there is valid: a whole context
        target[key] = None
    return value


def mutations(count: int, seed: int = 41) -> list[Hostile]:
    """`count` seeded variations of the valid bodies, the same in every run."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        path, body = VALID[i % len(VALID)]
        out.append(Hostile(f"mutation {i} of {path}", path, _json(_mutate(body, rng))))
    return out
