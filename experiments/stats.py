"""The statistics of the experimental standard (issue 40): honest intervals for proportions and seed-level claims.

    wilson(0, 24)               # (0.0, 0.138): an interval that is honest at 0 and 1, never [0, 0]
    clopper_pearson(24, 24)     # (0.858, 1.0): the exact (conservative) interval
    over_seeds([0.6, 0.7, 0.9, 0.5, 0.8])   # mean, sd, t and bootstrap 95% CIs with the seed as the unit
    paired_seeds({0: 0.5, 1: 0.6}, {0: 0.7, 1: 0.65})   # per-seed deltas b - a, their mean and CI, wins

Pure Python (no scipy): the t and beta quantiles come from the regularised incomplete beta function.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"betainc needs a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _bisect(f: Any, target: float, low: float, high: float) -> float:
    """The x in [low, high] with f(x) = target, for an increasing f (to about 1e-12)."""
    for _ in range(200):
        mid = (low + high) / 2
        if f(mid) < target:
            low = mid
        else:
            high = mid
        if high - low < 1e-13:
            break
    return (low + high) / 2


def beta_quantile(q: float, a: float, b: float) -> float:
    """The q-quantile of Beta(a, b)."""
    return _bisect(lambda x: betainc(a, b, x), q, 0.0, 1.0)


def normal_quantile(q: float) -> float:
    """The q-quantile of the standard normal (0 < q < 1)."""
    if not 0 < q < 1:
        raise ValueError(f"normal_quantile needs 0 < q < 1, got {q}")
    return _bisect(lambda x: 0.5 * math.erfc(-x / math.sqrt(2)), q, -40.0, 40.0)


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with ``df`` degrees of freedom (0 < q < 1)."""
    if not (0 < q < 1 and df > 0):
        raise ValueError(f"t_quantile needs 0 < q < 1 and df > 0, got q={q}, df={df}")
    if q == 0.5:
        return 0.0

    def cdf(t: float) -> float:
        tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
        return 1 - tail if t > 0 else tail

    return _bisect(cdf, q, -1e4, 1e4)


def _check_counts(successes: int, n: int, confidence: float) -> None:
    if not (isinstance(successes, int) and isinstance(n, int) and 0 <= successes <= n and n >= 1):
        raise ValueError(f"need integers 0 <= successes <= n and n >= 1, got successes={successes!r}, n={n!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion: honest at 0 and n (0/24 -> [0, 0.138], not [0, 0])."""
    _check_counts(successes, n, confidence)
    z = normal_quantile(1 - (1 - confidence) / 2)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def clopper_pearson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a proportion: never narrower than the truth asks."""
    _check_counts(successes, n, confidence)
    alpha = 1 - confidence
    low = 0.0 if successes == 0 else beta_quantile(alpha / 2, successes, n - successes + 1)
    high = 1.0 if successes == n else beta_quantile(1 - alpha / 2, successes + 1, n - successes)
    return low, high


def proportion(successes: int, n: int, confidence: float = 0.95) -> dict[str, Any]:
    """A proportion as a record: value, Wilson and exact intervals, counts."""
    return {"value": successes / n, "successes": successes, "n": n, "wilson": list(wilson(successes, n, confidence)),
            "exact": list(clopper_pearson(successes, n, confidence)), "confidence": confidence}  # fmt: skip


def bootstrap_mean_ci(values: Sequence[float], *, confidence: float = 0.95, resamples: int = 10_000,
                      seed: int = 0) -> tuple[float, float] | None:  # fmt: skip
    """Percentile-bootstrap CI of the mean; None with fewer than two values."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    return means[int(tail * (resamples - 1))], means[int(math.ceil((1 - tail) * (resamples - 1)))]


def over_seeds(values: Sequence[float], *, confidence: float = 0.95, seed: int = 0,
               bounds: tuple[float, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """Mean over seeds (the seed is the unit) with a Student-t CI and a bootstrap CI; fewer than two seeds give
    no interval (``None``), never a zero-width one. ``bounds``: the outcome's possible range (a proportion's
    (0, 1)); the t interval is clipped to it (a success rate's interval never claims 1.08)."""
    values = [float(v) for v in values]
    if not values or any(math.isnan(v) for v in values):
        raise ValueError(f"over_seeds needs at least one value and no NaN, got {values}")
    n = len(values)
    mean = sum(values) / n
    out: dict[str, Any] = {"n": n, "mean": mean, "sd": None, "t": None, "bootstrap": None, "confidence": confidence}
    if n >= 2:
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
        low, high = mean - half, mean + half
        if bounds is not None:
            low, high = max(low, bounds[0]), min(high, bounds[1])
        out.update(sd=sd, t=[low, high],
                   bootstrap=list(bootstrap_mean_ci(values, confidence=confidence, seed=seed) or []))  # fmt: skip
    return out


def paired_seeds(a: Mapping[Any, float], b: Mapping[Any, float], *, confidence: float = 0.95,
                 bounds: tuple[float, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """Per-seed deltas ``b[s] - a[s]`` over the seeds both arms ran, their mean with t and bootstrap CIs, and how
    many seeds b won, tied and lost. Seeds only one arm ran are listed, never silently paired. ``bounds``: each
    arm's outcome range; a delta's interval is clipped to (low - high, high - low)."""
    common = sorted(set(a) & set(b), key=str)
    if not common:
        raise ValueError(f"paired_seeds: the arms share no seed (a: {sorted(a, key=str)}, b: {sorted(b, key=str)})")
    deltas = {s: float(b[s]) - float(a[s]) for s in common}
    spread = None if bounds is None else (bounds[0] - bounds[1], bounds[1] - bounds[0])
    out = over_seeds(list(deltas.values()), confidence=confidence, bounds=spread)
    out.update(deltas={str(s): d for s, d in deltas.items()}, wins=sum(d > 0 for d in deltas.values()),
               ties=sum(d == 0 for d in deltas.values()), losses=sum(d < 0 for d in deltas.values()),
               unpaired=sorted(map(str, set(a) ^ set(b))))  # fmt: skip
    return out


def verdict(paired: Mapping[str, Any], a: str, b: str) -> str:
    """The strongest claim a paired seed-level comparison supports, in words."""
    ci = paired.get("t")
    if ci is None:
        return f"{b} vs {a}: one seed, no claim"
    numbers = f"mean delta {paired['mean']:+.3f}, 95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}]"
    if ci[0] > 0:
        return f"{b} beats {a} at the seed level ({numbers})"
    if ci[1] < 0:
        return f"{a} beats {b} at the seed level ({numbers})"
    return f"{b} vs {a}: not shown ({numbers} covers 0)"
