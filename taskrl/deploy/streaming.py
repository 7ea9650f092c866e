"""Server-sent events in OpenAI's ``chat.completion.chunk`` shape, from one finished completion body.

The ``Policy`` contract returns whole turns, so the server samples the turn, logs it, and then streams it:
a role chunk, the content in pieces, one chunk per tool call, the finish reason, optional usage, ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

CONTENT_PIECE_CHARS = 16
"""Characters per content delta: small enough to look like streaming, few enough to stay cheap."""


def _chunk(body: dict[str, Any], delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
    """One SSE event; ``allow_nan=False``: a non-finite number fails here, before anything is logged or sent."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    chunk = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
        "choices": [choice],
        **extra,
    }
    return f"data: {json.dumps(chunk, allow_nan=False)}\n\n"


async def sse_events(body: dict[str, Any], *, include_usage: bool = False) -> AsyncIterator[str]:
    """The chunks of a ``chat.completion`` body, ending with ``data: [DONE]``."""
    for chunk in sse_chunks(body, include_usage=include_usage):
        yield chunk


def sse_chunks(body: dict[str, Any], *, include_usage: bool = False) -> list[str]:
    """Every SSE event of a ``chat.completion`` body, rendered up front (the server renders before it logs)."""
    out = list(_events(body, include_usage))
    return out


def _events(body: dict[str, Any], include_usage: bool) -> Any:
    choice = body["choices"][0]
    message = choice["message"]
    yield _chunk(body, {"role": "assistant", "content": ""})
    content = message.get("content") or ""
    for start in range(0, len(content), CONTENT_PIECE_CHARS):
        yield _chunk(body, {"content": content[start : start + CONTENT_PIECE_CHARS]})
    for index, call in enumerate(message.get("tool_calls") or []):
        yield _chunk(body, {"tool_calls": [{"index": index, **call}]})
    extra: dict[str, Any] = {}
    if "token_ids" in choice:  # vLLM-style extension, for token-exact clients
        extra = {"token_ids": choice["token_ids"], "prompt_token_ids": body.get("prompt_token_ids")}
    yield _chunk(body, {}, choice["finish_reason"], **extra)
    if include_usage:
        usage_chunk = {
            "id": body["id"],
            "object": "chat.completion.chunk",
            "created": body["created"],
            "model": body["model"],
            "choices": [],
            "usage": body["usage"],
        }
        yield f"data: {json.dumps(usage_chunk, allow_nan=False)}\n\n"
    yield "data: [DONE]\n\n"
