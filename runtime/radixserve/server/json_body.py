"""A request's JSON body parsed once, on the event loop, as fast as it can be: by the body guard,
with pydantic-core's parser (Rust: a 20 MB list of token ids in a third of `json`'s time), then
handed to the route through the ASGI scope, where FastAPI would otherwise parse it again. What
pydantic-core refuses (a lone surrogate escape, deep nesting, a byte-order mark, trailing text) is
parsed by `json`, so a body means, and fails, exactly as it always did."""
from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute

SCOPE_KEY = "radixserve.json_body"


def parse(body: bytes) -> Any:
    """`json.loads(body)`, faster where it can be; its ValueError and RecursionError otherwise."""
    try:
        return pydantic_core.from_json(body)
    except ValueError:
        return json.loads(body)


class _ParsedJsonRequest(Request):
    async def json(self) -> Any:
        if SCOPE_KEY in self.scope:
            return self.scope[SCOPE_KEY]
        return await super().json()


class ParsedJsonRoute(APIRoute):
    """A route whose handler reads the body the guard parsed (`SCOPE_KEY`) instead of parsing it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_json_handler(request: Request) -> Response:
            return await handler(_ParsedJsonRequest(request.scope, request.receive))

        return parsed_json_handler
