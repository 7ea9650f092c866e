"""The eval gate: promote a candidate only when no metric regresses significantly against the baseline.

``bootstrap_diff_ci`` is a percentile bootstrap of mean(candidate) - mean(baseline) (paired when both
samples come from the same tasks in the same order); ``gate_decision`` applies it to every metric of
every suite and returns the verdict with its evidence. ``ConsecutiveWins`` is the seed's alternative
rule (promote after N consecutive sessions the candidate won). ``evaluate_env`` runs an env suite.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from taskrl.policies.base import Policy


@dataclass
class GateConfig:
    """When a candidate counts as a regression."""

    confidence: float = 0.95
    """Two-sided confidence of the bootstrap interval of the difference of means."""
    margin: float = 0.0
    """A drop smaller than this is tolerated (the interval's upper end must fall below -margin to block)."""
    n_boot: int = 2000
    """Bootstrap resamples."""
    min_samples: int = 2
    """Fewest scores per side for a metric to be judged; with fewer the gate blocks (no evidence, no promotion)."""
    lower_is_better: tuple[str, ...] = ()
    """Metrics where smaller is better (latency, invalid calls); their differences are negated."""
    seed: int = 0
    """Seed of the bootstrap, so a decision is reproducible from its evidence."""

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"GateConfig.confidence must be in (0.5, 1), got {self.confidence}")
        if self.margin < 0:
            raise ValueError(f"GateConfig.margin must be >= 0, got {self.margin}")
        if self.n_boot < 100:
            raise ValueError(f"GateConfig.n_boot must be >= 100, got {self.n_boot}")
        if self.min_samples < 2:
            raise ValueError(f"GateConfig.min_samples must be >= 2, got {self.min_samples}")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def bootstrap_diff_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    confidence: float = 0.95,
    n_boot: int = 2000,
    paired: bool = False,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(difference of means, lower, upper) of mean(candidate) - mean(baseline), percentile bootstrap."""
    if len(baseline) < 1 or len(candidate) < 1:
        raise ValueError("bootstrap_diff_ci needs at least one score on each side")
    if paired and len(baseline) != len(candidate):
        raise ValueError(f"paired bootstrap needs equal lengths, got {len(baseline)} and {len(candidate)}")
    rng = random.Random(seed)
    diffs = []
    if paired:
        pair_diffs = [c - b for b, c in zip(baseline, candidate, strict=True)]
        n = len(pair_diffs)
        for _ in range(n_boot):
            diffs.append(_mean([pair_diffs[rng.randrange(n)] for _ in range(n)]))
    else:
        nb, nc = len(baseline), len(candidate)
        for _ in range(n_boot):
            b = _mean([baseline[rng.randrange(nb)] for _ in range(nb)])
            c = _mean([candidate[rng.randrange(nc)] for _ in range(nc)])
            diffs.append(c - b)
    diffs.sort()
    alpha = (1 - confidence) / 2
    lower = diffs[int(alpha * (n_boot - 1))]
    upper = diffs[int((1 - alpha) * (n_boot - 1))]
    return _mean(candidate) - _mean(baseline), lower, upper


@dataclass
class GateResult:
    """The gate's verdict and, per metric, the numbers that decided it."""

    promote: bool
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


def gate_decision(
    baseline: dict[str, Sequence[float]],
    candidate: dict[str, Sequence[float]],
    config: GateConfig | None = None,
    *,
    paired: bool = False,
) -> GateResult:
    """Block when any metric's difference (sign-adjusted) is significantly below -margin, or lacks samples."""
    config = config or GateConfig()
    missing = sorted(set(baseline) ^ set(candidate))
    if missing:
        return GateResult(False, f"metrics not measured on both sides: {', '.join(missing)}")
    broken = sorted(name for name, values in candidate.items() if not all(math.isfinite(float(v)) for v in values))
    if broken:  # a NaN score compares false with every bound: it must block, never pass by accident
        return GateResult(False, f"non-finite candidate scores in {', '.join(broken)}", {"non_finite": broken})
    evidence: dict[str, Any] = {}
    regressions, thin = [], []
    for name in sorted(baseline):
        base, cand = list(baseline[name]), list(candidate[name])
        if min(len(base), len(cand)) < config.min_samples:
            thin.append(name)
            evidence[name] = {"n_baseline": len(base), "n_candidate": len(cand)}
            continue
        sign = -1.0 if name in config.lower_is_better else 1.0
        diff, lower, upper = bootstrap_diff_ci(
            [sign * x for x in base],
            [sign * x for x in cand],
            confidence=config.confidence,
            n_boot=config.n_boot,
            paired=paired,
            seed=config.seed,
        )
        regressed = upper < -config.margin
        evidence[name] = {
            "baseline_mean": _mean(base),
            "candidate_mean": _mean(cand),
            "diff": sign * diff,
            "ci": [lower, upper] if sign > 0 else [-upper, -lower],
            "n_baseline": len(base),
            "n_candidate": len(cand),
            "regressed": regressed,
        }
        if regressed:
            regressions.append(name)
    if regressions:
        return GateResult(False, f"significant regression in {', '.join(regressions)}", evidence)
    if thin:
        return GateResult(False, f"fewer than {config.min_samples} scores for {', '.join(thin)}", evidence)
    return GateResult(True, "no metric regressed significantly", evidence)


class ConsecutiveWins:
    """The seed's rule: promote after ``n`` consecutive sessions the candidate won (a loss resets the streak)."""

    def __init__(self, n: int = 500) -> None:
        if n < 1:
            raise ValueError(f"ConsecutiveWins.n must be >= 1, got {n}")
        self.n = n
        self.streak = 0
        self.sessions = 0

    def update(self, candidate_won: bool) -> bool:
        """Record one session's outcome; True once the streak reaches ``n``."""
        self.sessions += 1
        self.streak = self.streak + 1 if candidate_won else 0
        return self.streak >= self.n

    def evidence(self) -> dict[str, Any]:
        return {"rule": "consecutive_wins", "n": self.n, "streak": self.streak, "sessions": self.sessions}


async def evaluate_env(env_name: str, policy: Policy, *, n_tasks: int | None = None, seed: int = 0) -> dict[str, list]:
    """One eval suite: play ``env_name``'s eval tasks once each; per-episode reward and invalid-call counts."""
    from taskrl.env import make
    from taskrl.rollout import RolloutConfig, run_episodes

    env = make(env_name)
    tasks = list(env.tasks("eval") if _has_split(env, "eval") else env.tasks())[:n_tasks]
    trajectories = await run_episodes(lambda: make(env_name), policy, tasks, RolloutConfig(seed=seed))
    return {
        "reward": [t.reward for t in trajectories],
        "invalid_tool_calls": [t.metrics.get("invalid_tool_calls", 0.0) for t in trajectories],
    }


def _has_split(env: Any, split: str) -> bool:
    try:
        return bool(list(env.tasks(split)))
    except (TypeError, ValueError, KeyError):
        return False
