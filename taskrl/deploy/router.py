"""The router: which policy version answers each session of a served model.

A ``Router`` holds the versions of one model: ``stable``, at most one ``candidate`` in canary stages
(1% -> 5% -> 20% -> 100% by default), a
``holdout`` share of sessions that stays on the previous policy, and an optional ``shadow`` version that
sees mirrored requests. Assignment hashes the session id with a secret salt (random per deployment unless
configured), so a session is sticky, a session on the canary stays on it as the stage grows, and clients
cannot pick their arm. Live evidence is counted in distinct sessions, not signals: each session contributes
the mean of its interactions' latest rewards, and no tenant supplies more than ``max_tenant_share`` of the
sessions counted, so one client cannot promote or roll back a candidate by itself; tenants the feedback-trust
check excludes (``set_untrusted``) are not counted at all. Both stage rules use one
statistic, Welch's t interval of (candidate - stable) mean live reward per session: the candidate rolls
back when the interval lies below ``-rollback_margin`` (significantly worse), and it advances a stage (or is
promoted from the last) only after ``min_samples`` sessions in the stage *and* when the interval's lower end
is at least ``-advance_margin`` (shown not worse by more than that), never on session counts alone. A stage
that stays inconclusive for ``max_stage_samples`` sessions rolls back. Every decision goes to
``on_decision`` with its evidence, naming the candidate.

The rollback test is sequential: it runs at *looks*, when the candidate's counted sessions first reach
``rollback_min_samples`` x 1, 2, 4, 8, ..., and look k (from 0) uses confidence 1 - (1 - c) / 2**(k+1) for
``rollback_confidence`` c. The error rates spent over all looks sum to 1 - c, so a candidate no worse than
stable is rolled back with probability at most 1 - c (two-sided; the rollback uses one side) however long its
canary runs. Testing after every session instead (``sequential_rollback=False``) peeks dozens of times: in
benchmarks/canary_bench.py the old rule (a bootstrap after every session) rolled back about one equal
candidate in five where a one-sided 95% test promises one in forty; the sequential rule, about one in fifty.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskrl.deploy.gate import welch_diff_ci
from taskrl.deploy.store import Decision
from taskrl.policies.base import Policy, PolicyBase
from taskrl.policies.memory import release_freed

logger = logging.getLogger(__name__)


@dataclass
class RouterConfig:
    """Canary stages, holdout and the live rollback rule."""

    stages: tuple[float, ...] = (0.01, 0.05, 0.2, 1.0)
    """Share of (non-holdout) sessions on the candidate at each canary stage; the last must be 1.0."""
    min_samples: int = 100
    """Distinct sessions with feedback the candidate must collect in a stage before it advances."""
    holdout: float = 0.05
    """Share of sessions that stays on the previous policy (Cursor-style 5-10% holdout); 0 disables it."""
    rollback_min_samples: int = 30
    """Distinct candidate sessions with feedback needed before the live rollback test runs."""
    rollback_confidence: float = 0.95
    """Confidence of the interval (Welch's t) of (candidate - stable) live reward."""
    rollback_margin: float = 0.0
    """Roll back when the interval's upper end is below -rollback_margin."""
    sequential_rollback: bool = True
    """Run the rollback test only at looks (doubling session counts) with the error rate split over them (see
    the module docstring); False tests after every session at ``rollback_confidence`` (inflates false rollbacks,
    kept for comparison)."""
    advance_margin: float = 0.1
    """Advance a stage (or promote) only when the same interval's lower end is >= -advance_margin: the live
    evidence shows the candidate not worse than stable by more than this (non-inferiority)."""
    max_stage_samples: int = 0
    """Counted sessions after which a stage that neither advanced nor rolled back rolls back as inconclusive
    (0: ten times ``min_samples``), so an unproven candidate cannot hold the canary forever."""
    salt: str | None = None
    """Secret hash salt of session assignment; None draws a random one per router (arms then reshuffle on a
    restart: set it, e.g. ``TASKRL_ROUTER_SALT``, to keep sessions sticky across restarts)."""
    max_tenant_share: float = 0.5
    """Most of the counted sessions one tenant may supply (stage advance and rollback evidence); 1 disables it.
    ``create_app`` uses 1 when only one tenant can exist (no or one API key tenant)."""

    def __post_init__(self) -> None:
        if not self.stages or any(not 0 < s <= 1 for s in self.stages) or list(self.stages) != sorted(self.stages):
            raise ValueError(f"RouterConfig.stages must be increasing shares in (0, 1], got {self.stages}")
        if self.stages[-1] != 1.0:
            raise ValueError(f"RouterConfig.stages must end at 1.0 (full rollout), got {self.stages}")
        if self.min_samples < 1:
            raise ValueError(f"RouterConfig.min_samples must be >= 1, got {self.min_samples}")
        if not 0 <= self.holdout < 0.5:
            raise ValueError(f"RouterConfig.holdout must be in [0, 0.5), got {self.holdout}")
        if self.rollback_min_samples < 2:
            raise ValueError(f"RouterConfig.rollback_min_samples must be >= 2, got {self.rollback_min_samples}")
        if not 0.5 < self.rollback_confidence < 1:
            raise ValueError(f"RouterConfig.rollback_confidence must be in (0.5, 1), got {self.rollback_confidence}")
        if not (math.isfinite(self.rollback_margin) and self.rollback_margin >= 0):
            raise ValueError(f"RouterConfig.rollback_margin must be a finite number >= 0, got {self.rollback_margin}")
        if not (math.isfinite(self.advance_margin) and self.advance_margin >= 0):
            raise ValueError(f"RouterConfig.advance_margin must be a finite number >= 0, got {self.advance_margin}")
        if self.max_stage_samples == 0:
            self.max_stage_samples = 10 * self.min_samples
        if self.max_stage_samples < self.min_samples:
            raise ValueError(
                f"RouterConfig.max_stage_samples must be 0 or >= min_samples ({self.min_samples}), "
                f"got {self.max_stage_samples}"
            )
        if not 0 < self.max_tenant_share <= 1:
            raise ValueError(f"RouterConfig.max_tenant_share must be in (0, 1], got {self.max_tenant_share}")
        if self.salt is not None and not self.salt:
            raise ValueError("RouterConfig.salt must not be empty (None draws a random secret)")


class RouterError(ValueError):
    """A routing operation that does not apply (unknown version, a canary already running)."""


class LiveEvidence:
    """Latest reward per (session, signal key) of one version, grouped by tenant."""

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, float]] = {}
        self.tenant_of: dict[str, str] = {}

    def add(self, session: str, tenant: str, key: str, reward: float) -> None:
        self.sessions.setdefault(session, {})[key] = reward  # a repeated signal replaces the earlier one
        self.tenant_of.setdefault(session, tenant)

    def sample(
        self, max_tenant_share: float, only: set[str] | None = None, untrusted: frozenset[str] = frozenset()
    ) -> list[float]:
        """One value (mean reward) per counted session, no tenant above ``max_tenant_share`` of them, and none of
        an ``untrusted`` tenant's."""
        by_tenant: dict[str, list[str]] = {}
        anonymous = []  # observations without a tenant (unit tests, replays) are not capped
        for session in self.sessions:
            if only is None or session in only:
                tenant = self.tenant_of[session]
                if tenant in untrusted:
                    continue
                if tenant:
                    by_tenant.setdefault(tenant, []).append(session)
                else:
                    anonymous.append(session)
        n = _balanced_size([len(v) for v in by_tenant.values()], max_tenant_share)
        cap = n if max_tenant_share >= 1 else math.floor(max_tenant_share * n)
        counted = [s for sessions in by_tenant.values() for s in sessions[:cap]][:n] + anonymous
        return [sum(self.sessions[s].values()) / len(self.sessions[s]) for s in counted]


def _balanced_size(counts: list[int], share: float) -> int:
    """Largest N with sum(min(count, floor(share * N))) >= N: sessions countable under the tenant cap."""
    total = sum(counts)
    if share >= 1:
        return total
    for n in range(total, 0, -1):
        cap = math.floor(share * n)
        if sum(min(c, cap) for c in counts) >= n:
            return n
    return 0


def _close(box: list[PolicyBase]) -> None:
    """Close a retired policy, drop it, and hand its freed memory back to the OS (glibc keeps it otherwise:
    the production service's RSS grew by GBs per cycle with versions retired)."""
    policy = box.pop()
    try:
        policy.close()
    except Exception:  # a policy that fails to close must not take the router down with it
        logger.exception("closing retired policy %s failed", policy.name)
    del policy
    release_freed()


def rollback_look(n: int, first: int) -> int | None:
    """The rollback look a count of ``n`` sessions has reached: k for ``first * 2**k <= n``, None below ``first``."""
    if n < first:
        return None
    return (n // first).bit_length() - 1


def look_confidence(confidence: float, look: int) -> float:
    """Confidence of rollback look ``look``: its error rate is (1 - confidence) / 2**(look + 1), so the looks'
    rates sum to at most 1 - confidence (a union bound over any number of looks)."""
    return 1 - (1 - confidence) / 2 ** (look + 1)


def session_unit(session_id: str, salt: str) -> float:
    """A stable number in [0, 1) for a session (independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b(f"{salt}:{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class Router:
    """Versions of one served model and the rule that picks one per session."""

    def __init__(
        self,
        model: str,
        policy: Policy,
        config: RouterConfig | None = None,
        *,
        on_decision: Callable[[Decision], None] | None = None,
        adapter: dict[str, str] | None = None,
    ) -> None:
        """``adapter``: the LoRA adapter (``name``, ``path``) the first version serves, when it is one."""
        self.model = model
        self.config = config or RouterConfig()
        self.versions: dict[int, Policy] = {int(policy.version): policy}
        self.adapters: dict[int, dict[str, str]] = {int(policy.version): dict(adapter)} if adapter else {}
        """Version -> the LoRA adapter it serves (``name``, ``path``); versions absent here serve base weights."""
        self.stable = self.previous = int(policy.version)
        self.candidate: int | None = None
        self.shadow: int | None = None
        self.stage = 0
        self.stage_samples = 0
        self.stage_sessions: set[str] = set()
        self.live: dict[int, LiveEvidence] = {}
        self.decisions: list[Decision] = []
        self.on_decision = on_decision
        self._salt = self.config.salt if self.config.salt is not None else secrets.token_hex(16)
        self._anonymous = 0
        self._next_look = 0  # the candidate's next rollback look (sequential_rollback)
        self.untrusted: frozenset[str] = frozenset()
        """Tenants whose live rewards no stage rule counts (``set_untrusted``)."""
        self._highest = int(policy.version)  # version numbers are never reused, retired or not

    # -- versions --------------------------------------------------------------------------------
    def add_version(self, policy: Policy, adapter: dict[str, str] | None = None) -> int:
        """Register ``policy`` as the next version (its ``version`` attribute is set to match) and return it.

        ``adapter`` (``name``, ``path``) records the LoRA adapter the version serves, for every row it answers."""
        version = max(self._highest, *self.versions) + 1
        self._highest = version
        policy.version = version
        self.versions[version] = policy
        if adapter:
            self.adapters[version] = dict(adapter)
        self._decide("add_version", None, version, {"name": policy.name, **({"adapter": adapter} if adapter else {})})
        return version

    def adapter_of(self, version: int) -> dict[str, Any] | None:
        """``{"name", "path", "version"}`` of the adapter ``version`` serves, or None for base weights."""
        found = self.adapters.get(version)
        return None if found is None else {**found, "version": version}

    def live_versions(self) -> set[int]:
        """Versions a session can reach now: stable, the holdout's previous, the candidate and the shadow."""
        return {v for v in (self.stable, self.previous, self.candidate, self.shadow) if v is not None}

    def retire(self, version: int) -> Decision:
        """Drop a version no session can reach (see ``live_versions``) and release its weights and KV cache.

        A deployment adds a version every cycle, and each one kept holds a model copy and its prefix cache: the
        production benchmark's server grew to 17 GB and was killed for memory. Requests already running on the
        version finish before its policy closes (in a background thread); its number is never given again."""
        self._check(version)
        if version in self.live_versions():
            raise RouterError(f"{self.model} v{version} is still routable (stable, previous, candidate or shadow)")
        policy = self.versions.pop(version)
        decision = self._decide("retire", version, None, {"name": policy.name})
        if isinstance(policy, PolicyBase):
            box = [policy]  # the thread takes the last reference, so the weights are freed before the trim
            del policy
            threading.Thread(target=_close, args=(box,), name=f"taskrl-retire-v{version}", daemon=True).start()
        return decision

    def _check(self, version: int) -> None:
        if version not in self.versions:
            raise RouterError(f"{self.model} has no version {version}; known: {sorted(self.versions)}")

    def start_canary(self, version: int) -> None:
        """Send the first stage's share of sessions to ``version``."""
        self._check(version)
        if self.candidate is not None:
            raise RouterError(f"{self.model} already has candidate {self.candidate} in canary; promote or roll back")
        if version == self.stable:
            raise RouterError(f"version {version} is already stable")
        self.candidate, self.stage, self.stage_samples = version, 0, 0
        self.stage_sessions = set()
        self.live = {}
        self._next_look = 0
        self._decide("start_canary", self.stable, version, {"share": self.config.stages[0]})

    def set_shadow(self, version: int | None) -> None:
        """Mirror requests to ``version`` without returning its output (None stops shadowing)."""
        if version is not None:
            self._check(version)
        self._decide("shadow", self.shadow, version, {})
        self.shadow = version

    def activate(self, version: int, evidence: dict | None = None) -> None:
        """Make ``version`` stable at once (skipping the canary), keeping the old one for the holdout."""
        self._check(version)
        self._promote(version, {"forced": True, **(evidence or {})})

    def set_untrusted(self, tenants: set[str] | frozenset[str], evidence: dict | None = None) -> Decision | None:
        """Stop counting these tenants' live rewards in the canary's tests (and count the others again).

        The feedback-trust check (``taskrl.deploy.feedback_trust``) that keeps a contradicting tenant out of training
        keeps it out of the live evidence too: otherwise a tenant that accepts bad answers props up a degraded
        canary (and one that rejects good answers rolls a good one back). A change is a logged decision."""
        tenants = frozenset(tenants)
        if tenants == self.untrusted:
            return None
        self.untrusted = tenants
        if self.candidate is not None:  # the counts change under the running stage
            sample = self.live.get(self.candidate)
            self.stage_samples = (
                len(sample.sample(self.config.max_tenant_share, self.stage_sessions, tenants)) if sample else 0
            )
        return self._decide(
            "untrusted_tenants", self.stable, self.candidate, {"tenants": sorted(tenants), **(evidence or {})}
        )

    # -- routing ---------------------------------------------------------------------------------
    def route(self, session_id: str) -> tuple[int, str]:
        """(version, arm) for a session; arm is stable, canary or holdout."""
        unit = session_unit(session_id, self._salt)
        # The holdout arm exists only once there is a previous policy to hold out on: with one version
        # "holdout" would be the stable policy under another name, and its sessions would be counted apart.
        holdout = self.config.holdout if self.previous != self.stable else 0.0
        if unit < holdout:
            return self.previous, "holdout"
        if self.candidate is not None:
            position = (unit - holdout) / (1 - holdout)
            if position < self.config.stages[self.stage]:
                return self.candidate, "canary"
        return self.stable, "stable"

    def policy(self, version: int) -> Policy:
        return self.versions[version]

    # -- live metric, stages, rollback -------------------------------------------------------------
    def observe(
        self,
        version: int,
        reward: float,
        *,
        session_id: str | None = None,
        tenant: str | None = None,
        key: str | None = None,
    ) -> Decision | None:
        """Record a live reward for ``version``; may advance the canary, promote it, or roll it back.

        ``key`` names the signal (interaction and kind): the same key again replaces the earlier reward.
        Without ``session_id`` the reward counts as its own session of its own tenant (unit tests, replays).
        """
        if session_id is None:
            self._anonymous += 1
            session_id, tenant = f"anonymous-{self._anonymous}", None
        evidence = self.live.setdefault(version, LiveEvidence())
        evidence.add(session_id, tenant or "", key or f"signal-{len(evidence.sessions.get(session_id, {}))}", reward)
        if self.candidate is None or version != self.candidate:
            return None
        self.stage_sessions.add(session_id)
        self.stage_samples = len(evidence.sample(self.config.max_tenant_share, self.stage_sessions, self.untrusted))
        rollback_test = self._rollback_test()
        if rollback_test is not None and rollback_test["ci"][1] < -self.config.rollback_margin:
            return self.rollback({"reason": "significantly worse than stable", **rollback_test})
        if self.stage_samples < self.config.min_samples:
            return None
        test = self._live_test()
        out = {"stage": self.stage, "samples": self.stage_samples, **(test or self._live_summary())}
        if test is None or test["ci"][0] < -self.config.advance_margin:
            if self.stage_samples >= self.config.max_stage_samples:
                why = "too few sessions for the live test" if test is None else "not shown non-inferior"
                return self.rollback({"reason": f"inconclusive after {self.stage_samples} sessions: {why}", **out})
            return None  # hold the stage: counts alone never advance a candidate
        if self.stage + 1 < len(self.config.stages):
            self.stage += 1
            self.stage_samples = 0
            self.stage_sessions = set()
            out["share"] = self.config.stages[self.stage]
            return self._decide("advance", self.stable, self.candidate, out)
        return self._promote(self.candidate, out)

    def _sample(self, version: int | None) -> list[float]:
        live = self.live.get(version) if version is not None else None
        return live.sample(self.config.max_tenant_share, untrusted=self.untrusted) if live is not None else []

    def _live_summary(self) -> dict:
        out: dict = {}
        for name, version in (("stable", self.stable), ("candidate", self.candidate)):
            values = self._sample(version)
            out[f"{name}_n"] = len(values)
            out[f"{name}_mean"] = sum(values) / len(values) if values else None
        return out

    def _rollback_test(self) -> dict | None:
        """The live test at this session if it is a rollback look (every session when not sequential)."""
        if not self.config.sequential_rollback:
            return self._live_test()
        look = rollback_look(len(self._sample(self.candidate)), self.config.rollback_min_samples)
        if look is None or look < self._next_look:
            return None
        self._next_look = look + 1  # looks skipped by a jump in the count are not spent (conservative)
        test = self._live_test(look_confidence(self.config.rollback_confidence, look))
        return None if test is None else {**test, "look": look}

    def _live_test(self, confidence: float | None = None) -> dict | None:
        """Welch's t interval of (candidate - stable) per-session live reward, or None without enough sessions."""
        candidate = self._sample(self.candidate)
        stable = self._sample(self.stable)
        if len(candidate) < self.config.rollback_min_samples or len(stable) < 2:
            return None
        confidence = self.config.rollback_confidence if confidence is None else confidence
        diff, lower, upper = welch_diff_ci(stable, candidate, confidence=confidence)
        return {"diff": diff, "ci": [lower, upper], "confidence": confidence,
                "rollback_margin": self.config.rollback_margin, "advance_margin": self.config.advance_margin,
                **self._live_summary()}  # fmt: skip

    def rollback(self, evidence: dict | None = None) -> Decision:
        """Send every session back to the stable version and drop the candidate."""
        if self.candidate is None:
            raise RouterError(f"{self.model} has no candidate to roll back")
        candidate = self.candidate
        decision = self._decide(
            "rollback", candidate, self.stable, {"stage": self.stage, "candidate": candidate, **(evidence or {})}
        )  # logged while the candidate is still set, so on_decision and state() see which version it was
        self.candidate = None
        return decision

    def _promote(self, version: int, evidence: dict) -> Decision:
        old, candidate = self.stable, self.candidate
        decision = self._decide("promote", old, version, {"candidate": candidate, **evidence})
        self.previous, self.stable = old, version  # after logging: the decision names the candidate it promoted
        if self.candidate == version:
            self.candidate = None
        return decision

    def _decide(self, kind: str, from_version: int | None, to_version: int | None, evidence: dict) -> Decision:
        decision = Decision(self.model, kind, from_version, to_version, evidence)
        self.decisions.append(decision)
        if self.on_decision is not None:
            self.on_decision(decision)
        return decision

    def state(self) -> dict:
        """What /v1/router reports: versions, arms and the canary's progress."""
        return {
            "model": self.model,
            "versions": sorted(self.versions),
            "stable": self.stable,
            "previous": self.previous,
            "candidate": self.candidate,
            "shadow": self.shadow,
            "stage": self.stage if self.candidate is not None else None,
            "share": self.config.stages[self.stage] if self.candidate is not None else None,
            "stage_samples": self.stage_samples,
            **self._live_summary(),
            "rule": {  # the canary rule in force (settable with serve/cycle flags); never the salt
                "stages": list(self.config.stages),
                "min_samples": self.config.min_samples,
                "holdout": self.config.holdout,
                "rollback_min_samples": self.config.rollback_min_samples,
                "rollback_confidence": self.config.rollback_confidence,
                "sequential_rollback": self.config.sequential_rollback,
                "rollback_margin": self.config.rollback_margin,
                "advance_margin": self.config.advance_margin,
                "max_stage_samples": self.config.max_stage_samples,
            },
            "untrusted_tenants": sorted(self.untrusted),
        }
