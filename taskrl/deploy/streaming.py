"""Server-sent events in OpenAI's ``chat.completion.chunk`` shape, built token by token as a turn is sampled.

``ContentStream`` turns sampled token ids into content deltas that are safe to send at once: text is held back
while it may still begin a tool call (``<tool_call>``) or a client stop string, and nothing past either is sent
as content. ``StreamEvents`` renders the chunks: the role, each content delta with the logprobs of the tokens it
covers, then (once the turn is parsed and logged) the rest of the content, the tool calls, the finish reason
with any remaining logprobs, optional usage and ``[DONE]``. A backend that returns whole turns streams through
the same code with all its tokens at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

CALL_OPEN = "<tool_call>"


def _hold_back(text: str, markers: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


class ContentStream:
    """Incremental detokenisation of one turn into sendable content deltas (see the module docstring).

    Decoding uses a sliding prefix (as vLLM does): the new tokens are decoded together with a few before them and
    only the added text is kept, so tokenizers that merge spaces across tokens decode as the whole would."""

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]) -> None:
        self.decode = decode
        self.markers = [CALL_OPEN, *[s for s in stops if s]]
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        """Characters of ``text`` already sent as content."""
        self.closed = False
        """A tool call or stop string began: the rest of the turn is sent once it is parsed."""
        self._prefix = 0
        self._read = 0

    def push(self, token_ids: list[int]) -> str:
        """Add sampled tokens; returns the content that may be sent now (possibly empty)."""
        self.ids.extend(token_ids)
        before = self.decode(self.ids[self._prefix : self._read])
        after = self.decode(self.ids[self._prefix :])
        if after.endswith("\ufffd"):  # a multi-byte character is split across tokens: wait for the rest
            return ""
        self.text += after[len(before) :]
        self._prefix, self._read = max(self._read - 4, 0), len(self.ids)
        if self.closed:
            return ""
        found = [i for i in (self.text.find(m, self.sent) for m in self.markers) if i >= 0]
        if found:
            end, self.closed = min(found), True
        else:
            end = len(self.text) - _hold_back(self.text, self.markers)
        delta = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return delta

    @property
    def sent_text(self) -> str:
        return self.text[: self.sent]


class StreamEvents:
    """Renders the SSE events of one ``chat.completion.chunk`` stream (ids, model and created fixed up front)."""

    def __init__(self, completion_id: str, model: str, created: int) -> None:
        self.base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None, logprobs: list | None = None,
              **extra: Any) -> str:  # fmt: skip
        """One SSE event; ``allow_nan=False``: a non-finite number fails here, before it is sent."""
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason,
                  "logprobs": None if logprobs is None else {"content": logprobs}}  # fmt: skip
        return f"data: {json.dumps({**self.base, 'choices': [choice], **extra}, allow_nan=False)}\n\n"

    def role(self) -> str:
        return self.chunk({"role": "assistant", "content": ""})

    def ending(self, body: dict[str, Any], sent_content: str, entries_sent: int, *, include_usage: bool) -> list[str]:
        """The events after the streamed content, from the turn's finished ``chat.completion`` body."""
        choice = body["choices"][0]
        message = choice["message"]
        entries = (choice.get("logprobs") or {}).get("content")
        rest = entries[entries_sent:] if entries is not None else None
        events = []
        content = message.get("content") or ""
        if content.startswith(sent_content) and len(content) > len(sent_content):
            events.append(self.chunk({"content": content[len(sent_content) :]}))
        for index, call in enumerate(message.get("tool_calls") or []):
            events.append(self.chunk({"tool_calls": [{"index": index, **call}]}))
        extra: dict[str, Any] = {}
        if "token_ids" in choice:  # vLLM-style extension, for token-exact clients
            extra = {"token_ids": choice["token_ids"], "prompt_token_ids": body.get("prompt_token_ids")}
        events.append(self.chunk({}, choice["finish_reason"], rest, **extra))
        if include_usage:
            usage = {**self.base, "choices": [], "usage": body["usage"]}
            events.append(f"data: {json.dumps(usage, allow_nan=False)}\n\n")
        events.append("data: [DONE]\n\n")
        return events

    def error(self, status: int, message: str, kind: str = "server_error", code: str | None = None) -> str:
        """An error event ending a stream that cannot finish (no ``[DONE]`` follows)."""
        body = {"error": {"message": message, "type": kind, "param": None, "code": code or str(status)}}
        return f"data: {json.dumps(body)}\n\n"


def sse_chunks(body: dict[str, Any], *, include_usage: bool = False, stops: list[str] | None = None) -> list[str]:
    """Every SSE event of a finished ``chat.completion`` body (backends that return whole turns). With logprobs,
    content is sent token by token, each chunk with its tokens' logprobs; without, in one piece."""
    choice = body["choices"][0]
    events = StreamEvents(body["id"], body["model"], body["created"])
    out = [events.role()]
    entries = (choice.get("logprobs") or {}).get("content")
    sent, used = "", 0
    if entries:
        token_text = [entry["token"] for entry in entries]
        stream = ContentStream(lambda ids: "".join(token_text[i] for i in ids), stops or [])
        for i in range(len(token_text)):
            delta = stream.push([i])
            if delta:
                out.append(events.chunk({"content": delta}, logprobs=entries[used : i + 1]))
                used = i + 1
        sent = stream.sent_text
    out.extend(events.ending(body, sent, used, include_usage=include_usage))
    return out
