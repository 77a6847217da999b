"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}` for every failure."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          422: "invalid_request_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, e.param, e.code), status_code=e.status)


def bad_value(e: ValueError) -> APIError:
    """A ValueError from validation: its message starts with the field's name."""
    return APIError(400, str(e), str(e).split(" ", 1)[0] or None)


def _validation(exc: RequestValidationError) -> APIError:
    err = exc.errors()[0] if exc.errors() else {}
    if err.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('msg', '')}")
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    return APIError(400, f"{param or 'body'}: {err.get('msg', 'invalid value')}", param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(APIError(exc.status_code, str(exc.detail)))
