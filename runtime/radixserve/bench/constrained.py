"""The JSON schema that `radixserve bench offline --constrained` puts on every request: an
extraction-style record with nested objects, arrays, enums and bounded strings, long enough that
a request still makes many tokens before the grammar completes."""
from __future__ import annotations

import json
from pathlib import Path

BENCH_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "title", "status", "tags", "items"],
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 10**6},
        "title": {"type": "string", "maxLength": 80},
        "status": {"enum": ["open", "closed", "pending"]},
        "tags": {"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 24}},
        "items": {"type": "array", "maxItems": 64, "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "qty"],
            "properties": {"name": {"type": "string", "maxLength": 32},
                           "qty": {"type": "integer", "minimum": 0, "maximum": 999}},
        }},
    },
}


def bench_schema(path: str | None) -> str:
    """The schema as JSON text: the file at `path`, else `BENCH_SCHEMA`; SystemExit if unusable."""
    if path is None:
        return json.dumps(BENCH_SCHEMA)
    try:
        text = Path(path).read_text()
        json.loads(text)
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench: --json-schema {path}: {e}") from None
    return text
