"""The OpenAPI document, made to say what the server sends: validation failures are 400 (not
FastAPI's 422) with OpenAI's error body, `/metrics` is Prometheus text, the POST routes stream
`text/event-stream` when asked (the generating ones), and every route but the open ones needs the bearer key."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_WHY = {400: "Invalid request (OpenAI error body)", 401: "Missing or wrong API key",
        404: "Unknown model", 500: "Internal error of this request", 503: "The server is failing or shutting down"}
# status codes each operation may answer besides 200, before the 401 of a keyed route
_ERRORS = {
    ("post", "/v1/chat/completions"): (400, 404, 500, 503),
    ("post", "/v1/completions"): (400, 404, 500, 503),
    ("post", "/v1/responses"): (400, 404, 500, 503),
    ("post", "/v1/embeddings"): (400, 404, 500, 503),
    ("post", "/generate"): (400, 500, 503),
    **{("post", f"{v}/{op}"): (400, 404, 500, 503) for v in ("", "/v1") for op in ("tokenize", "detokenize")},
    ("get", "/v1/models/{model}"): (404,),
    ("get", "/health"): (503,),
    ("get", "/health_generate"): (503,),
}
_STREAMING = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate"})
# each server-sent event: `data:` is a JSON chunk, an error body, or `[DONE]` last
_SSE = {"text/event-stream": {"schema": {"type": "object", "required": ["data"],
                                         "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}}}


def _error(status: int) -> dict[str, Any]:
    return {"description": _WHY[status], "content": {"application/json": {"schema": _ERROR_REF}}}


def build_openapi(app: FastAPI, open_paths: frozenset[str], keyed: bool) -> dict[str, Any]:
    spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = spec.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Error"] = _ERROR_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            responses.pop("422", None)
            for status in _ERRORS.get((method, path), ()):
                responses[str(status)] = _error(status)
            if method == "post" and path in _STREAMING:
                responses["200"]["content"].update(_SSE)
            if keyed and path not in open_paths:
                op["security"] = [{"bearer": []}]
                responses["401"] = _error(401)
    metrics = spec["paths"].get("/metrics", {}).get("get")
    if metrics is not None:
        metrics["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
    return spec


def install_openapi(app: FastAPI, open_paths: frozenset[str], keyed: bool) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, open_paths, keyed)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
