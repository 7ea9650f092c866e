"""Errors answered in OpenAI's JSON shape, shared by the chat, feedback and admin endpoints."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "code"}}``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def error_response(status: int, message: str, kind: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(status_code=status, content=body)
