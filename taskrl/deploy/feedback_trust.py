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

A tenant with fewer than ``min_overlap`` comparisons is not judged yet, and ``unjudged`` says what its signals
do meanwhile: ``"keep"`` (the default: train on them; a single-tenant deployment has nobody to compare with),
``"corroborated"`` (train only on the signals another trusted tenant's signal on the same answer agrees with: an
adversary's first signals cannot steer the first cycles, since it contradicts everyone) or ``"drop"`` (train
on judged tenants only; the first cycles wait until someone is judged).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from taskrl.deploy.feedback import RewardMap
from taskrl.deploy.store import Decision, Feedback, Interaction, InteractionStore

AnswerKey = Callable[[Interaction], str | None]
"""What makes two replies "the same answer" (None: the reply is not compared)."""
Unjudged = Literal["keep", "corroborated", "drop"]
UNJUDGED: tuple[str, ...] = ("keep", "corroborated", "drop")


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


Votes = dict[tuple[str, str], dict[str, list[tuple[str, int]]]]
"""(prompt tokens, answer key) -> tenant -> that tenant's (feedback id, sign) on this answer."""


def answer_votes(
    interactions: list[Interaction],
    feedback: list[Feedback],
    reward_map: RewardMap | None = None,
    *,
    answer_key: AnswerKey = reply_text,
) -> Votes:
    """Every opinion signal (+1 liked, -1 disliked) grouped by the (prompt, answer) it judged, per tenant.
    Signals whose reward is 0 or None carry no opinion and are left out."""
    reward_map = reward_map or RewardMap()
    answer_of: dict[str, tuple[str, str]] = {}
    for row in interactions:
        key = answer_key(row)
        if key is not None and isinstance(row.prompt_token_ids, list):
            answer_of[row.id] = (",".join(map(str, row.prompt_token_ids)), key)
    votes: Votes = defaultdict(lambda: defaultdict(list))
    for item in feedback:
        reward = reward_map.signal_reward(item)
        if item.interaction_id in answer_of and reward:
            votes[answer_of[item.interaction_id]][item.tenant].append((item.id, 1 if reward > 0 else -1))
    return votes


def tenant_agreement(
    interactions: list[Interaction],
    feedback: list[Feedback],
    reward_map: RewardMap | None = None,
    *,
    answer_key: AnswerKey = reply_text,
) -> dict[str, TenantAgreement]:
    """Agreement of every tenant that gave feedback with the others' majority on the same (prompt, answer)."""
    out = {item.tenant: TenantAgreement(item.tenant) for item in feedback}
    for by_tenant in answer_votes(interactions, feedback, reward_map, answer_key=answer_key).values():
        if len(by_tenant) < 2:
            continue
        for tenant, signs in by_tenant.items():
            others = sum(s for other, values in by_tenant.items() if other != tenant for _, s in values)
            if others == 0:
                continue
            majority = 1 if others > 0 else -1
            out[tenant].comparisons += len(signs)
            out[tenant].agreements += sum(1 for _, s in signs if s == majority)
    return out


def corroborated_signals(votes: Votes, *, ignore: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Ids of the signals that at least one other tenant (not in ``ignore``) gave the same sign on the same answer."""
    out: set[str] = set()
    for by_tenant in votes.values():
        for tenant, signs in by_tenant.items():
            seen = {s for other, values in by_tenant.items() if other != tenant and other not in ignore
                    for _, s in values}  # fmt: skip
            out.update(fid for fid, s in signs if s in seen)
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
        unjudged: Unjudged = "keep",
    ) -> None:
        if unjudged not in UNJUDGED:
            raise ValueError(f"TrustedFeedbackStore.unjudged must be one of {', '.join(UNJUDGED)}, got {unjudged!r}")
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
        self.unjudged: Unjudged = unjudged
        self.agreement: dict[str, TenantAgreement] = {}
        self.excluded: set[str] = set()
        self.unjudged_tenants: set[str] = set()
        """Tenants with fewer than ``min_overlap`` comparisons at the last refresh."""
        self.corroborated: set[str] = set()
        """Ids of the unjudged tenants' signals another trusted tenant agreed with (``unjudged="corroborated"``)."""
        self.held_back = 0
        """Signals of unjudged tenants the last ``feedback()`` left out."""
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
        votes = answer_votes(rows, signals, self.reward_map, answer_key=self.answer_key)
        self.agreement = tenant_agreement(rows, signals, self.reward_map, answer_key=self.answer_key)
        self.excluded = {
            name
            for name, found in self.agreement.items()
            if found.comparisons >= self.min_overlap and (found.rate or 0.0) < self.min_agreement
        }
        self.unjudged_tenants = {n for n, found in self.agreement.items() if found.comparisons < self.min_overlap}
        # an excluded tenant's agreement vouches for nobody
        corroborating = self.unjudged == "corroborated"
        self.corroborated = corroborated_signals(votes, ignore=self.excluded) if corroborating else set()
        self.updated_at = time.time()
        return self.excluded

    def _trained_on(self, item: Feedback) -> bool:
        if item.tenant in self.excluded:
            return False
        if self.unjudged == "keep" or item.tenant not in self.unjudged_tenants:
            return True
        return self.unjudged == "corroborated" and item.id in self.corroborated

    def feedback(self, *, interaction_ids: list[str] | None = None, tenant: str | None = None) -> list[Feedback]:
        """The store's feedback without the excluded tenants' and, unless ``unjudged="keep"``, without the unjudged
        tenants' signals that rule leaves out (trust is recomputed on every call: each cycle reads once)."""
        self.refresh()
        signals = self.store.feedback(interaction_ids=interaction_ids, tenant=tenant)
        kept = [f for f in signals if self._trained_on(f)]
        self.held_back = sum(1 for f in signals if f.tenant not in self.excluded) - len(kept)
        return kept

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
            "unjudged": self.unjudged,
            "unjudged_tenants": sorted(self.unjudged_tenants),
            "unjudged_signals_held_back": self.held_back,
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
