"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}` for every failure.
Messages never echo more than a short prefix of what the client sent (`short`)."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          422: "invalid_request_error", 503: "service_unavailable"}
_ECHO_CHARS = 40
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none",  # pydantic union-branch names
              "message", "function_call", "function_call_output", "reasoning"}  # and the Responses items' tags


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def short(value: object) -> str:
    """A client-given value as it may appear in a message: at most a short prefix of its repr."""
    text = repr(value)
    return text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "…"


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(e: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, e.param, e.code), status_code=e.status, headers=headers)


def bad_value(e: ValueError, names: dict[str, str] | None = None) -> APIError:
    """A ValueError from validation: its message starts with the field's name, which `names`
    maps to the name the client used (chat's `top_logprobs` is the engine's `logprobs`)."""
    field, _, rest = str(e).partition(" ")
    field = (names or {}).get(field, field)
    return APIError(400, f"{field} {rest}" if rest else field, field or None)


def _most_specific(errors: list[dict]) -> dict:
    """Of a union's per-branch errors, a bound or value error beats a type mismatch; then depth."""
    return max(errors, key=lambda e: (not str(e.get("type", "")).endswith("_type"), len(e.get("loc", ()))))


def _validation(exc: RequestValidationError | ValidationError) -> APIError:
    errors = list(exc.errors())
    err = _most_specific(errors) if errors else {}
    if err.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON")
    if tuple(err.get("loc", ())) == ("body",):
        # no body, a form, a JSON array or a scalar: name the real problem, not pydantic's "dictionary"
        what = "is missing" if err.get("type") == "missing" else "must be a JSON object"
        return APIError(400, f"the request body {what}; send a JSON object with Content-Type: application/json")
    loc = [str(p) for p in err.get("loc", ()) if p != "body" and "[" not in str(p) and str(p) not in _TYPE_TAGS]
    param = ".".join(loc) or None
    return APIError(400, f"{param or 'body'}: {err.get('msg', 'invalid value')}", param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation(exc))

    # A handler that validates a model it builds itself (the Responses API's chat request) raises
    # pydantic's own error: the client's input at fault, as for the body's
    @app.exception_handler(ValidationError)
    async def _built_invalid(_: Request, exc: ValidationError) -> JSONResponse:
        return error_response(_validation(exc))

    # NOTE: bad input that escaped the edge's checks (body_guard.py bounds depth and text): the
    # request's fault, never a 500
    @app.exception_handler(RecursionError)
    async def _too_deep(_: Request, exc: RecursionError) -> JSONResponse:
        return error_response(APIError(400, "the request nests too deeply"))

    @app.exception_handler(UnicodeError)
    async def _bad_text(_: Request, exc: UnicodeError) -> JSONResponse:
        return error_response(APIError(400, "the request holds text that is not valid Unicode"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # NOTE: keep the exception's headers: a 405 must say which methods are allowed (`Allow`)
        return error_response(APIError(exc.status_code, str(exc.detail)), exc.headers)
