"""Schedules: a value as a function of the training step (learning rate, entropy coefficient, reward weights).

Every schedule is a small frozen dataclass with ``__call__(step) -> float``; ``make_schedule`` builds one from
a config value: a number (constant), or a dict such as ``{"kind": "cosine", "start": 3e-5, "end": 1e-6,
"steps": 1000}``. Seed defaults: entropy 0.01 -> 0.001 linear; LR cosine 3e-5 -> 1e-6 or three-phase
(5e-5 below 10k steps, 1e-5 below 100k, then 5e-6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol


class Schedule(Protocol):
    def __call__(self, step: int) -> float: ...


@dataclass(frozen=True)
class Constant:
    value: float

    def __call__(self, step: int) -> float:
        return self.value


@dataclass(frozen=True)
class Linear:
    """From ``start`` to ``end`` over ``steps`` steps (after ``warmup`` steps at ``start``), then flat."""

    start: float
    end: float
    steps: int
    warmup: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"Linear schedule needs steps >= 1 and warmup >= 0, got {self.steps}, {self.warmup}")

    def __call__(self, step: int) -> float:
        frac = max(step - self.warmup, 0) / self.steps
        return self.end if frac >= 1 else self.start + (self.end - self.start) * frac


@dataclass(frozen=True)
class Cosine:
    """Half-cosine from ``start`` to ``end`` over ``steps`` steps (after ``warmup`` linear steps from 0)."""

    start: float
    end: float
    steps: int
    warmup: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"Cosine schedule needs steps >= 1 and warmup >= 0, got {self.steps}, {self.warmup}")

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.start * (step + 1) / self.warmup
        frac = min((step - self.warmup) / self.steps, 1.0)
        return self.end + (self.start - self.end) * 0.5 * (1 + math.cos(math.pi * frac))


@dataclass(frozen=True)
class Piecewise:
    """``values[i]`` while ``step < boundaries[i]``; the last value after the last boundary."""

    boundaries: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.values) != len(self.boundaries) + 1:
            raise ValueError("Piecewise schedule needs one more value than boundaries")
        if list(self.boundaries) != sorted(self.boundaries):
            raise ValueError(f"Piecewise boundaries must increase, got {self.boundaries}")

    def __call__(self, step: int) -> float:
        for boundary, value in zip(self.boundaries, self.values, strict=False):
            if step < boundary:
                return value
        return self.values[-1]


def three_phase_lr() -> Piecewise:
    """The seed's three-phase LR: 5e-5 below 10k steps, 1e-5 below 100k, then 5e-6."""
    return Piecewise((10_000, 100_000), (5e-5, 1e-5, 5e-6))


_KINDS = {"constant": Constant, "linear": Linear, "cosine": Cosine, "piecewise": Piecewise}


def make_schedule(spec: float | int | dict[str, Any] | Schedule, *, field: str = "schedule") -> Schedule:
    """Build a schedule from a number, a ``{"kind": ...}`` dict, or pass one through; errors name ``field``."""
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return Constant(float(spec))
    if isinstance(spec, dict):
        args = dict(spec)
        kind = args.pop("kind", None)
        if kind == "three_phase":
            return three_phase_lr()
        if kind not in _KINDS:
            raise ValueError(f"{field}: unknown schedule kind {kind!r}; use one of {sorted(_KINDS) + ['three_phase']}")
        if kind == "piecewise":
            args = {"boundaries": tuple(args.get("boundaries", ())), "values": tuple(args.get("values", ()))}
        try:
            return _KINDS[kind](**args)
        except TypeError as e:
            raise ValueError(f"{field}: bad arguments for a {kind} schedule: {e}") from None
    if callable(spec):
        return spec
    raise ValueError(f"{field}: a schedule is a number or a dict with 'kind', got {spec!r}")
