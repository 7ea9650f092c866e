"""Per-tenant request limits: a token-bucket rate and a concurrency cap; over either is a 429 in OpenAI's shape.

Limits are per tenant (every API key maps to one), so a tenant cannot multiply its quota with more keys.
The bucket holds 10 seconds' worth of requests (``rate / 6``, at least 1) and refills continuously.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from taskrl.deploy.errors import APIError

BURST_SECONDS = 10.0


class TenantLimiter:
    """``with limiter.hold(tenant):`` around a request; raises a 429 ``APIError`` when over a limit."""

    def __init__(self, per_minute: int | None, max_concurrent: int | None) -> None:
        self.rate = per_minute / 60.0 if per_minute else None
        self.capacity = max(1.0, self.rate * BURST_SECONDS) if self.rate else 0.0
        self.max_concurrent = max_concurrent
        self._tokens: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)
        self._active: dict[str, int] = {}

    def _take(self, tenant: str) -> None:
        if self.rate is None:
            return
        now = time.monotonic()
        tokens, at = self._tokens.get(tenant, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            wait = math.ceil((1.0 - tokens) / self.rate)
            raise APIError(
                429, f"rate limit of {self.rate * 60:g} requests/minute reached for this API key; retry in {wait}s",
                "rate_limit_error", code="rate_limit_exceeded", headers={"Retry-After": str(wait)},
            )  # fmt: skip
        self._tokens[tenant] = (tokens - 1.0, now)

    @contextlib.contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        active = self._active.get(tenant, 0)
        if self.max_concurrent is not None and active >= self.max_concurrent:
            raise APIError(
                429, f"at most {self.max_concurrent} concurrent requests per API key; wait for one to finish",
                "rate_limit_error", code="concurrency_limit_exceeded", headers={"Retry-After": "1"},
            )  # fmt: skip
        self._take(tenant)
        self._active[tenant] = active + 1
        try:
            yield
        finally:
            self._active[tenant] -= 1
            if not self._active[tenant]:
                del self._active[tenant]
