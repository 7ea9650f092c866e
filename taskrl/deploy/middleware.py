"""The server's ASGI middleware: body size limit (413), request ids (``X-Request-Id``), a last-resort 500, and
``Connection: close`` while draining.

``create_app`` installs them outermost first: ``RequestId`` (every response carries the id), ``CloseWhileDraining``
(no connection is kept alive past a drain, so no client reuses one the server is about to close), ``CatchAll`` (an
unhandled exception becomes OpenAI-shaped JSON), ``BodySizeLimit`` (nothing over the limit reaches a handler).
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any

from taskrl.deploy.errors import error_response

logger = logging.getLogger(__name__)


class BodySizeLimit:
    """ASGI middleware: a body over ``max_bytes`` gets 413 before any handler parses it.

    A declared ``Content-Length`` is checked at once; a chunked body (no length) is read here up to the limit and
    handed on whole, since an error raised while the framework reads the body would reach the client as a 400."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        declared = int(length) if length and length.isdigit() else None
        if declared is not None and declared > self.max_bytes:
            await self._refuse(f"request body of {declared} bytes exceeds {self.max_bytes}", scope, receive, send)
            return
        if declared is not None:  # the HTTP parser never delivers more than the declared length
            await self.app(scope, receive, send)
            return
        buffered: list[dict] = []
        seen = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break  # the client left: the app sees the disconnect
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                await self._refuse(f"request body exceeds {self.max_bytes} bytes", scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> dict:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, message: str, scope: dict, receive: Any, send: Any) -> None:
        response = error_response(413, message, "invalid_request_error", code="request_too_large",
                                  headers={"Connection": "close"})  # fmt: skip
        await response(scope, receive, send)


REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""An ``X-Request-Id`` a client may choose; anything else (too long, control characters, spaces) is replaced."""


class RequestId:
    """ASGI middleware: every response carries ``X-Request-Id``, the client's own when it is well-formed, else a
    fresh one (so a hostile value never reaches logs or response headers); handlers read ``scope["request_id"]``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = sent if REQUEST_ID.fullmatch(sent) else f"req-{secrets.token_hex(16)}"
        scope["request_id"] = request_id

        async def tagged_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", request_id.encode())]}
            await send(message)

        await self.app(scope, receive, tagged_send)


class CatchAll:
    """ASGI middleware: an unhandled exception becomes a 500 in OpenAI's JSON shape, and the connection stays up
    (Starlette's own handler answers text/plain and re-raises, which makes uvicorn drop the connection)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            logger.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if started:
                return  # a stream already under way cannot change its status; the client sees it cut short
            response = error_response(500, f"internal server error ({type(exc).__name__})", "server_error")
            await response(scope, receive, send)


class CloseWhileDraining:
    """ASGI middleware: once ``state.draining`` is set, every response says ``Connection: close``, so each client
    opens a new connection for its next request (refused once the listener closes) instead of reusing one the
    server may close while the request is on the wire (which the client sees as a cut request)."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing_send(message: dict) -> None:
            if message["type"] == "http.response.start" and self.state.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing_send)
