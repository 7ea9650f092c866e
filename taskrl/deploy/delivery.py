"""What the server holds while a response is under way: its admission, its stream, and whether it arrived.

``Admission`` keeps a request's tenant slot and the in-flight count (what a drain waits on) until its response
is sent, a stream's to the last chunk; ``ClosingStream`` tells its callbacks when a stream ends, sent in full or
not, and cancels the generation behind it; ``Delivery`` marks a logged turn undelivered when it did not arrive;
``LiveTurn`` is a chat turn streamed as it is sampled (``server.create_app``'s ``live_events``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import StreamingResponse

from taskrl.deploy.generation import TurnPlan, completion_id
from taskrl.deploy.metrics import ServerMetrics
from taskrl.deploy.router import Router
from taskrl.deploy.schemas import ChatCompletionRequest
from taskrl.deploy.store import InteractionStore, StoreError
from taskrl.policies.base import Policy, PolicyBase

logger = logging.getLogger(__name__)


class ClosingStream(StreamingResponse):
    """A streamed response that calls each ``on_close(completed)`` when it ends, sent in full or not (the client
    left, the transport broke), and closes its body iterator at once so the generation behind it is cancelled."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_close: list[Callable[[bool], None]] = []
        self.completed = False

    async def stream_response(self, send: Any) -> None:
        await super().stream_response(send)
        self.completed = True

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            for callback in self.on_close:
                callback(self.completed)


class Delivery:
    """Marks an interaction undelivered when its response never fully reached the client."""

    def __init__(self, store: InteractionStore | None, interaction_id: str | None, metrics: ServerMetrics) -> None:
        self.store, self.interaction_id, self.metrics = store, interaction_id, metrics

    def undelivered(self, model: str) -> None:
        self.metrics.count("undelivered", model)
        if self.store is not None and self.interaction_id is not None:
            try:
                self.store.mark_undelivered(self.interaction_id)
            except StoreError:
                logger.error("interaction %s undelivered but could not be marked", self.interaction_id)

    def stream(self, chunks: list[str], headers: dict[str, str], model: str) -> ClosingStream:
        """A pre-rendered stream (backends that return whole turns)."""

        async def body() -> Any:
            for chunk in chunks:
                yield chunk

        response = ClosingStream(body(), media_type="text/event-stream", headers=headers)
        response.on_close.append(lambda completed: None if completed else self.undelivered(model))
        return response


class Admission:
    """A request's place in the server: its tenant's concurrency slot and the in-flight count the drain waits on,
    held until its response has been sent (a stream's too), released exactly once."""

    def __init__(self, app_state: Any, metrics: ServerMetrics, tenant: str) -> None:
        self.state, self.metrics = app_state, metrics
        self.hold = app_state.limiter.hold(tenant)
        self.hold.__enter__()  # 429 here when the tenant is at its limit
        app_state.in_flight += 1
        metrics.in_flight.inc()
        self.open = True

    def close(self, *_: Any) -> None:
        if self.open:
            self.open = False
            self.state.in_flight -= 1
            self.metrics.in_flight.dec()
            self.hold.__exit__(None, None, None)


def streams_tokens(policy: Policy) -> bool:
    """Whether ``policy`` yields tokens as they are sampled (it overrides ``PolicyBase.stream``)."""
    return policy.chat_format is not None and isinstance(policy, PolicyBase) and type(policy).stream is not (
        PolicyBase.stream
    )


@dataclass
class LiveTurn:
    """A chat turn streamed as it is sampled: what ``live_events`` needs, decided before the first byte."""

    request: ChatCompletionRequest
    policy: Policy
    plan: TurnPlan
    router: Router
    version: int
    arm: str
    tenant: str
    session_id: str
    started: float
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))
