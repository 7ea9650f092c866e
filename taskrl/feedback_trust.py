"""Tenant trust for training on production feedback: a tenant that contradicts everyone else is not trained on.

Feedback is an attack surface: one client that rejects good answers and accepts bad ones would teach the model
the opposite of what users want. ``tenant_agreement`` compares each tenant's signals with the other tenants'
signals on the *same answer to the same prompt* (identical prompt tokens, equal ``answer_key`` of the reply) and
counts how often its sign matches their majority. ``TrustedFeedbackStore(store, ...)`` wraps an
``InteractionStore`` for ``trajectories_from_store``/``ProductionCycle``: its ``feedback()`` leaves out every tenant
whose agreement, over at least ``min_overlap`` comparisons, is below ``min_agreement``; everything else passes
through unchanged, except that ``fresh_since`` (a time) and ``max_fresh`` (a count) limit ``interactions()`` to
the newest rows, not trained on before.
``excluded`` and ``report()`` say who was dropped and why (log them with each cycle).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskrl.deploy.feedback import RewardMap
from taskrl.deploy.store import Decision, Feedback, Interaction, InteractionStore

AnswerKey = Callable[[Interaction], str | None]
"""What makes two replies "the same answer" (None: the reply is not compared)."""


def reply_text(row: Interaction) -> str | None:
    """The default answer key: the reply's text, lower-cased with whitespace collapsed."""
    message = row.response.get("message") if isinstance(row.response, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return " ".join(content.lower().split()) if isinstance(content, str) and content.strip() else None


@dataclass
class TenantAgreement:
    """How one tenant's signals compare with the other tenants' on the same answers."""

    tenant: str
    comparisons: int = 0
    """Signals of this tenant on answers that other tenants also judged (ties among them are skipped)."""
    agreements: int = 0
    """Of those, how many had the same sign as the other tenants' majority."""

    @property
    def rate(self) -> float | None:
        return self.agreements / self.comparisons if self.comparisons else None


def tenant_agreement(
    interactions: list[Interaction],
    feedback: list[Feedback],
    reward_map: RewardMap | None = None,
    *,
    answer_key: AnswerKey = reply_text,
) -> dict[str, TenantAgreement]:
    """Agreement of every tenant that gave feedback with the others' majority on the same (prompt, answer)."""
    reward_map = reward_map or RewardMap()
    answer_of: dict[str, tuple[str, str]] = {}
    for row in interactions:
        key = answer_key(row)
        if key is not None and isinstance(row.prompt_token_ids, list):
            answer_of[row.id] = (",".join(map(str, row.prompt_token_ids)), key)
    # sign of each tenant's signals per answer: +1 liked, -1 disliked (0-reward signals carry no opinion)
    votes: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    out: dict[str, TenantAgreement] = {}
    for item in feedback:
        out.setdefault(item.tenant, TenantAgreement(item.tenant))
        reward = reward_map.signal_reward(item)
        if item.interaction_id in answer_of and reward:
            votes[answer_of[item.interaction_id]][item.tenant].append(1 if reward > 0 else -1)
    for by_tenant in votes.values():
        if len(by_tenant) < 2:
            continue
        for tenant, signs in by_tenant.items():
            others = sum(s for other, values in by_tenant.items() if other != tenant for s in values)
            if others == 0:
                continue
            majority = 1 if others > 0 else -1
            out[tenant].comparisons += len(signs)
            out[tenant].agreements += sum(1 for s in signs if s == majority)
    return out


class TrustedFeedbackStore:
    """An ``InteractionStore`` view whose ``feedback()`` omits tenants that disagree with everyone else."""

    def __init__(
        self,
        store: InteractionStore,
        reward_map: RewardMap | None = None,
        *,
        min_agreement: float = 0.5,
        min_overlap: int = 20,
        answer_key: AnswerKey = reply_text,
        model: str | None = None,
    ) -> None:
        if not 0 < min_agreement <= 1:
            raise ValueError(f"TrustedFeedbackStore.min_agreement must be in (0, 1], got {min_agreement}")
        if min_overlap < 1:
            raise ValueError(f"TrustedFeedbackStore.min_overlap must be >= 1, got {min_overlap}")
        self.store = store
        self.reward_map = reward_map or RewardMap()
        self.min_agreement = min_agreement
        self.min_overlap = min_overlap
        self.answer_key = answer_key
        self.model = model
        self.agreement: dict[str, TenantAgreement] = {}
        self.excluded: set[str] = set()
        self.updated_at: float | None = None
        self.fresh_since: float | None = None
        """When set, ``interactions()`` returns only rows created at or after it (training takes fresh samples only;
        trust is still computed over the whole history)."""
        self.max_fresh: int | None = None
        """When set, ``interactions()`` returns at most this many of the newest rows (bounds a cycle's cost)."""

    def refresh(self) -> set[str]:
        """Recompute every tenant's agreement over the whole store (all versions); returns the excluded tenants."""
        rows = self.store.interactions(model=self.model, include_shadow=False)
        signals = self.store.feedback(interaction_ids=[r.id for r in rows]) if rows else []
        self.agreement = tenant_agreement(rows, signals, self.reward_map, answer_key=self.answer_key)
        self.excluded = {
            name
            for name, found in self.agreement.items()
            if found.comparisons >= self.min_overlap and (found.rate or 0.0) < self.min_agreement
        }
        self.updated_at = time.time()
        return self.excluded

    def feedback(self, *, interaction_ids: list[str] | None = None, tenant: str | None = None) -> list[Feedback]:
        """The store's feedback without the excluded tenants' (recomputed on every call: each cycle reads once)."""
        self.refresh()
        return [f for f in self.store.feedback(interaction_ids=interaction_ids, tenant=tenant)
                if f.tenant not in self.excluded]  # fmt: skip

    def interactions(self, **filters: Any) -> list[Interaction]:
        """The store's interactions (oldest first), cut to ``fresh_since`` and ``max_fresh`` when they are set."""
        rows = self.store.interactions(**filters)
        if self.fresh_since is not None:
            rows = [r for r in rows if r.created_at >= self.fresh_since]
        return rows if self.max_fresh is None else rows[-self.max_fresh :]

    def report(self) -> dict[str, Any]:
        """Per-tenant agreement and who is excluded (JSON-ready)."""
        return {
            "excluded": sorted(self.excluded),
            "min_agreement": self.min_agreement,
            "min_overlap": self.min_overlap,
            "tenants": {
                name: {"comparisons": a.comparisons, "agreements": a.agreements, "rate": a.rate}
                for name, a in sorted(self.agreement.items())
            },
        }

    # -- the rest of the store's interface ProductionCycle and trajectories_from_store use: the real store's --
    async def add(self, table: str, row: Interaction | Feedback | Decision) -> str:
        return await self.store.add(table, row)

    def add_sync(self, table: str, row: Interaction | Feedback | Decision, timeout_s: float = 30.0) -> str:
        return self.store.add_sync(table, row, timeout_s)

    def decisions(self, *, model: str | None = None) -> list[Decision]:
        return self.store.decisions(model=model)

    def count(self, table: str = "interactions") -> int:
        return self.store.count(table)

    def max_version(self, model: str | None = None) -> int | None:
        return self.store.max_version(model)
