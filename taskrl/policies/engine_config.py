"""EngineConfig: the settings of ``HFPolicy``'s decode engines, one validated value that a policy, its rollout
copy and the continuous engine all take (``HFPolicy(model, tokenizer, engine_config=EngineConfig(...))``).

A leaf module: it imports nothing from taskrl, so the policy and its engines can share it.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("continuous", "static")
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
"""The prefix cache's default bound (1 GiB: ~23k SmolLM2-135M tokens in float32)."""
SCHEDULES = ("latency", "throughput")
"""How the continuous engine orders work: each request's pace (serving) or the whole batch's time (rollouts)."""


@dataclass(frozen=True)
class EngineConfig:
    """How an ``HFPolicy`` decodes; see ``taskrl.policies.hf`` and ``taskrl.policies.engine``."""

    engine: str = "continuous"
    """continuous (requests join the running batch at the next decode step) or static (gathered, then decoded)."""
    max_batch_size: int = 32
    """Most rows decoded in one forward."""
    batch_wait_s: float = 0.002
    """The static engine's gathering window."""
    prefill_chunk_tokens: int = 128
    """(Padded) prompt tokens the continuous engine prefills per step, so running rows keep decoding."""
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES
    """Bound of the continuous engine's KV prefix cache (0 disables reuse)."""
    draft_tokens: int = 4
    """Prompt-lookup drafts a decoding row may verify per step (0 disables speculative decoding; samples are the
    same either way)."""
    decode_token_budget: int | None = None
    """Most padded positions of a decode forward that drafts may fill (None: ``drafts.DECODE_TOKEN_BUDGETS``: on
    CPU 16 when serving, 32 in rollouts; 256 on an accelerator)."""
    schedule: str = "latency"
    """latency (serving: a prefill chunk costs about one decode forward, and requests for at most
    ``priority_tokens`` tokens decode in a lane of their own) or throughput (rollouts: full prefill chunks, one
    lane, the fewest forwards per batch of episodes)."""
    priority_tokens: int = 8
    """latency schedule: requests for at most this many tokens decode in their own lane (0: none)."""
    fast_forward: str | bool = "auto"
    """Run the continuous engine's forwards through ``taskrl.policies.fastpath`` (fused, LoRA merged, same
    results): True, False, or "auto" (on CPU only, where per-op overhead is a large share of a small model's)."""

    def __post_init__(self) -> None:
        def need(ok: bool, what: str, name: str, value: object) -> None:
            if not ok:
                raise ValueError(f"EngineConfig.{name} {what}, got {value!r}")

        need(self.engine in ENGINES, f"must be one of {', '.join(ENGINES)}", "engine", self.engine)
        need(self.max_batch_size >= 1, "must be >= 1", "max_batch_size", self.max_batch_size)
        need(self.batch_wait_s >= 0, "must be >= 0", "batch_wait_s", self.batch_wait_s)
        need(self.prefill_chunk_tokens >= 1, "must be >= 1", "prefill_chunk_tokens", self.prefill_chunk_tokens)
        need(self.prefix_cache_bytes >= 0, "must be >= 0", "prefix_cache_bytes", self.prefix_cache_bytes)
        need(self.schedule in SCHEDULES, f"must be one of {', '.join(SCHEDULES)}", "schedule", self.schedule)
        need(self.priority_tokens >= 0, "must be >= 0", "priority_tokens", self.priority_tokens)
        need(self.draft_tokens >= 0, "must be >= 0", "draft_tokens", self.draft_tokens)
        need(self.decode_token_budget is None or self.decode_token_budget >= 1, "must be >= 1",
             "decode_token_budget", self.decode_token_budget)  # fmt: skip
        need(self.fast_forward in (True, False, "auto"), "must be True, False or 'auto'", "fast_forward",
             self.fast_forward)  # fmt: skip
