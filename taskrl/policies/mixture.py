"""Cold start: a policy that answers with a rule-based guide at first and shifts traffic to a learned policy.

``MixturePolicy(guide, learned, schedule)`` sends each request to ``learned`` with probability
``schedule(step)`` (e.g. ``Linear(0.0, 1.0, steps=10)``), else to ``guide`` (a ScriptedPolicy); the caller
advances ``step`` once per cycle with ``set_step``. The choice is a seeded hash of the request, so a replay
routes the same way; ``Completion.info["mixture_arm"]`` records which one answered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from taskrl.policies.base import Completion, Policy, PolicyBase, SamplingParams
from taskrl.types import Message


class MixturePolicy(PolicyBase):
    """Guide (rules) and learned policy behind one ``Policy``; the learned share follows ``schedule``."""

    def __init__(
        self,
        guide: Policy,
        learned: Policy,
        schedule: Callable[[int], float],
        *,
        seed: int = 0,
        name: str | None = None,
    ) -> None:
        formats = (guide.chat_format, learned.chat_format)
        if None not in formats and formats[0].tokenizer is not formats[1].tokenizer:  # type: ignore[union-attr]
            raise ValueError("MixturePolicy: guide and learned policy must share one tokenizer (same chat_format)")
        self.guide = guide
        self.learned = learned
        self.schedule = schedule
        self.seed = seed
        self.step = 0
        self.counter = 0
        self.name = name or f"mixture({guide.name},{learned.name})"
        self.chat_format = learned.chat_format if learned.chat_format is not None else guide.chat_format

    @property
    def version(self) -> int:
        return self.learned.version

    @version.setter
    def version(self, value: int) -> None:
        self.learned.version = value

    def set_step(self, step: int) -> None:
        self.step = int(step)

    def learned_share(self) -> float:
        return min(1.0, max(0.0, float(self.schedule(self.step))))

    def _unit(self, sampling: SamplingParams) -> float:
        # Seeded requests route by their seed (replayable); unseeded ones by a per-policy counter.
        key = sampling.seed if sampling.seed is not None else f"n{self.counter}"
        self.counter += 1
        digest = hashlib.blake2b(f"{self.seed}:{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    async def generate(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> Completion:
        use_learned = self._unit(sampling) < self.learned_share()
        policy = self.learned if use_learned else self.guide
        completion = await policy.generate(token_ids=token_ids, messages=messages, tools=tools, sampling=sampling)
        completion.info["mixture_arm"] = "learned" if use_learned else "guide"
        # Guide turns carry logprob 0 (a rule, not a sample): train on them with SFT, not a ratio-based loss.
        completion.policy_version = self.version
        return completion
