"""Grammar-constrained decoding with the embedded SmolLM2-135M-Instruct (real text): bounded JSON
schemas complete and validate with `jsonschema`, regex and EBNF answers match, "any JSON object"
stays a valid prefix, and unconstrained neighbours keep their greedy tokens. Chunked prefill and
pages are on (prompts of ~45 tokens, prefill batches of 64)."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixserve import LLM, SamplingParams
from tests.runtime.test_constrained import assert_follows

SCHEMAS = [
    ("Give me a person as JSON.", {
        "type": "object", "additionalProperties": False, "required": ["name", "age"],
        "properties": {"name": {"type": "string", "maxLength": 20},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120}}}),
    ("What is the capital of France? Answer in JSON.", {
        "type": "object", "required": ["city", "country"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
                       "country": {"type": "string", "maxLength": 20}}}),
    ("List some colors in JSON.", {
        "type": "object", "required": ["colors"],
        "properties": {"colors": {"type": "array", "minItems": 1, "maxItems": 3,
                                  "items": {"enum": ["red", "green", "blue"]}}}}),
    ("Describe a famous book in JSON.", {
        "type": "object", "additionalProperties": False, "required": ["book"],
        "properties": {"book": {
            "type": "object", "additionalProperties": False, "required": ["title", "year"],
            "properties": {"title": {"type": "string", "maxLength": 30},
                           "year": {"type": "integer", "minimum": 1800, "maximum": 2030}}}}}),
    ("Is the sky blue? Answer in JSON.", {
        "type": "object", "required": ["answer"],
        "properties": {"answer": {"type": "boolean"}, "note": {"type": "string", "maxLength": 12}}}),
]
PLAIN = ["Tell me a joke.", "What is 2 + 2?"]
# The embedded model decoding whole JSON documents: minutes on a 2-core machine.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm():
    return LLM(None, dtype="float32", device="cpu", page_size=4, max_prefill_length=64)


def test_schemas_complete_and_validate_beside_unconstrained(llm) -> None:
    plain = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [r.token_ids for r in llm.generate(PLAIN, plain, chat=True)]
    params = [SamplingParams(max_tokens=96, json_schema=json.dumps(s)) for _, s in SCHEMAS]
    res = llm.generate([p for p, _ in SCHEMAS] + PLAIN, params + [plain] * len(PLAIN), chat=True)
    for r, (_, schema) in zip(res, SCHEMAS):
        assert r.finish_reason == "stop", r.text
        jsonschema.validate(json.loads(r.text), schema)
        assert_follows(llm.scheduler.model_path, "json_schema", json.dumps(schema), r.token_ids,
                       r.finish_reason)
    assert [r.token_ids for r in res[len(SCHEMAS):]] == alone
    assert json.loads(res[1].text)["city"] == "Paris"  # a real model: the mask keeps it sensible
    llm.scheduler.check_integrity()


def test_regex_ebnf_and_any_object(llm) -> None:
    date = r"\d{4}-\d{2}-\d{2}"
    ebnf = 'root ::= "The answer is " ("yes" | "no") "."'
    any_object = '{"type": "object"}'
    res = llm.generate(
        ["When did the French revolution begin? Answer as YYYY-MM-DD.",
         "Is Paris in France? Answer yes or no.", "Describe a cat in JSON."],
        [SamplingParams(max_tokens=20, regex=date), SamplingParams(max_tokens=20, ebnf=ebnf),
         SamplingParams(max_tokens=24, json_schema=any_object)], chat=True)
    assert res[0].finish_reason == res[1].finish_reason == "stop"
    assert re.fullmatch(date, res[0].text) and res[1].text in ("The answer is yes.",
                                                               "The answer is no.")
    path = llm.scheduler.model_path
    for r, grammar in zip(res, [("regex", date), ("ebnf", ebnf), ("json_schema", any_object)]):
        assert_follows(path, *grammar, r.token_ids, r.finish_reason)
    if res[2].finish_reason == "stop":  # free-form: it may or may not close within 24 tokens
        assert isinstance(json.loads(res[2].text), dict)
    else:
        assert res[2].text.startswith("{")
