"""``ServeConfig``: keys, limits, routing and reward settings of ``taskrl serve`` (one flat, validated dataclass)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from taskrl.deploy.feedback import RewardMap
from taskrl.deploy.router import RouterConfig
from taskrl.types import ToolCall
from taskrl.validate import above, optional, require

Approver = Callable[[str, ToolCall], "bool | Awaitable[bool]"]
"""Called as ``approve(tenant, call)`` before a sensitive tool call is handed to the client."""


@dataclass
class ServeConfig:
    """How the server authenticates, limits, logs and routes."""

    api_keys: dict[str, str] = field(default_factory=dict)
    """API key -> tenant. When set, chat needs a valid key; feedback always does (401 otherwise)."""
    admin_keys: tuple[str, ...] = ()
    """Keys allowed on admin endpoints (adapter loading, router control); none configured = admin disabled."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted; bigger ones get 413."""
    default_max_tokens: int = 512
    """Completion budget when a request names none."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """Canary stages, holdout share and live rollback rule of every served model."""
    reward_map: RewardMap = field(default_factory=RewardMap)
    """How feedback signals become rewards (live rollback metric and training)."""
    sensitive_tools: tuple[str, ...] = ()
    """Tool names whose calls need ``approve`` before they reach the client."""
    approve: Approver | None = None
    """Approval callback for sensitive tools; a sensitive call without one is withheld."""
    session_header: str = "x-session-id"
    """Header carrying the client session id (falls back to the request's ``user`` field)."""
    generation_timeout_s: float | None = 600.0
    """Per-request limit on sampling a turn; past it the generation is cancelled and the client gets 504."""
    max_context_tokens: int | None = None
    """Context length (prompt + completion) when the policy does not report one; longer requests get 400."""
    rate_limit_per_minute: int | None = None
    """Requests per minute per tenant (chat and feedback; a bucket of 10 s worth of burst); None = unlimited."""
    max_concurrent_per_tenant: int | None = None
    """Requests of one tenant handled at once; more get 429 at once. None = unlimited."""
    drain_timeout_s: float = 30.0
    """On SIGTERM: how long in-flight requests may take to finish before the server exits anyway."""
    allow_runtime_lora: bool = True
    """Whether ``/v1/load_lora_adapter`` is enabled (admin key still needed); ``taskrl serve`` turns it on only
    with ``--allow-runtime-lora``, like vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``."""
    adapter_root: str | None = None
    """When set, adapters load only from below this directory (symlinks resolved)."""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"ServeConfig.max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.default_max_tokens < 1:
            raise ValueError(f"ServeConfig.default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if any(not k for k in self.api_keys) or any(not t for t in self.api_keys.values()):
            raise ValueError("ServeConfig.api_keys must map non-empty keys to non-empty tenant names")
        if any(not k for k in self.admin_keys):
            raise ValueError("ServeConfig.admin_keys must not contain an empty key")
        require("ServeConfig", "must be > 0 or None", optional(above(0)),
                generation_timeout_s=self.generation_timeout_s, max_context_tokens=self.max_context_tokens,
                rate_limit_per_minute=self.rate_limit_per_minute,
                max_concurrent_per_tenant=self.max_concurrent_per_tenant)  # fmt: skip
        if not self.drain_timeout_s >= 0:
            raise ValueError(f"ServeConfig.drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        overlap = set(self.admin_keys) & set(self.api_keys)
        if overlap:
            raise ValueError("ServeConfig.admin_keys and api_keys must differ (an admin key is not a tenant)")

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of a ``Bearer KEY`` header, or None when it names no known key."""
        key = _bearer(authorization)
        return self.api_keys.get(key) if key else None

    def is_admin(self, authorization: str | None) -> bool:
        key = _bearer(authorization)
        return bool(key) and key in self.admin_keys

    def summary(self) -> dict[str, Any]:
        """What may be shown (no keys)."""
        return {"tenants": sorted(set(self.api_keys.values())), "admin": bool(self.admin_keys)}


def _bearer(authorization: str | None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        return ""
    return authorization[7:].strip()
