"""Errors answered in OpenAI's JSON shape, shared by every endpoint (chat, feedback, admin, unknown routes).

The body is always ``{"error": {"message", "type", "param", "code"}}`` with ``Content-Type: application/json``,
whatever went wrong: a bad field (400 naming it in ``param``), a malformed JSON body (400), an unknown route
(404), a body over the limit (413), a rate limit (429), an unhandled exception (500), a draining server (503).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

_DEFAULT_CODES = {
    401: "invalid_api_key",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    500: "internal_error",
    503: "service_unavailable",
    504: "timeout",
}


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status: int, message: str, kind: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code or _DEFAULT_CODES.get(status)}}


def error_response(
    status: int,
    message: str,
    kind: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = error_body(status, message, kind, param=param, code=code)
    return JSONResponse(status_code=status, content=body, headers=headers)


def api_error_response(exc: APIError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.kind, param=exc.param, code=exc.code, headers=exc.headers)


def invalid_param(param: str, message: str, code: str = "invalid_value") -> APIError:
    """A 400 naming the offending request field (what the openai SDK surfaces as ``BadRequestError.param``)."""
    return APIError(400, f"{param}: {message}", param=param, code=code)


def describe_validation(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, first offending field) of pydantic/FastAPI validation errors."""
    problems, first = [], None
    for error in errors:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        name = ".".join(loc) or "body"
        first = first or name
        problems.append(f"{name}: {error.get('msg')}")
    return "invalid request: " + "; ".join(problems), first
