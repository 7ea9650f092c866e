"""Curriculum: sample tasks by difficulty phases (Context-1: mostly few-hop first, then multi-hop) and drop
tasks whose groups carry no learning signal (always solved or never solved: zero-variance GRPO groups).

``CurriculumSampler(tasks, phases=[Phase(until_step, mix={difficulty: ratio})])``; ``sample(step, n, rng)``
returns tasks; ``update(task_id, rewards)`` feeds back a group's rewards. ``state_dict`` lets a run resume.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskrl.training.data import TaskSampler
from taskrl.types import Task

DIFFICULTY_KEY = "difficulty"
"""``task.info["difficulty"]``: any hashable label (e.g. the number of hops)."""


class CurriculumExhaustedError(RuntimeError):
    """Every task was dropped as always solved or never solved; there is nothing left to learn from."""


@dataclass(frozen=True)
class Phase:
    """A stretch of training with its own difficulty mix."""

    until_step: int | None
    """The phase covers steps below this (after the previous phase); None = until the end (last phase only)."""
    mix: Mapping[Hashable, float]
    """Difficulty -> sampling ratio; normalised, so {1: 3, 2: 1} means 75% one-hop."""

    def __post_init__(self) -> None:
        if not self.mix or any(not (r >= 0) for r in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError(f"Phase.mix needs non-negative ratios with a positive sum, got {dict(self.mix)}")
        if self.until_step is not None and self.until_step < 1:
            raise ValueError(f"Phase.until_step must be >= 1 or None, got {self.until_step}")


@dataclass
class _TaskStats:
    groups: int = 0
    solved_streak: int = 0
    unsolved_streak: int = 0


@dataclass
class CurriculumSampler(TaskSampler):
    """Deterministic given the ``rng``: samples exact per-phase difficulty counts (largest remainder).

    A task is dropped after ``patience`` consecutive groups that were all solved (every reward >=
    ``solved_at``, with ``drop_solved``) or all unsolved (every reward <= ``unsolved_at``, with
    ``drop_unsolved``). A difficulty left without tasks gives its share to the others of the phase.
    """

    tasks: Sequence[Task]
    """The task pool; each needs ``task.info["difficulty"]`` when phases are given."""
    phases: Sequence[Phase] = ()
    """Difficulty phases in order; empty = uniform over all tasks."""
    drop_solved: bool = False
    """Drop tasks the policy always solves."""
    drop_unsolved: bool = False
    """Drop tasks the policy never solves."""
    solved_at: float = 1.0
    """A reward at or above this counts as solved."""
    unsolved_at: float = 0.0
    """A reward at or below this counts as unsolved."""
    patience: int = 1
    """Consecutive all-solved (or all-unsolved) groups before a task is dropped."""
    dropped: dict[str, str] = field(default_factory=dict)
    """task id -> why it was dropped ("solved" / "unsolved")."""
    _stats: dict[str, _TaskStats] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("CurriculumSampler.tasks is empty")
        ids = [t.id for t in self.tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("CurriculumSampler.tasks: task ids must be unique")
        if self.patience < 1:
            raise ValueError(f"CurriculumSampler.patience must be >= 1, got {self.patience}")
        if self.unsolved_at >= self.solved_at:
            raise ValueError(
                f"CurriculumSampler: unsolved_at ({self.unsolved_at}) must be < solved_at ({self.solved_at})"
            )
        for i, phase in enumerate(self.phases):
            last = i == len(self.phases) - 1
            if (phase.until_step is None) != last:
                raise ValueError(f"CurriculumSampler.phases[{i}]: only the last phase has until_step=None")
            if i and not last and phase.until_step <= self.phases[i - 1].until_step:  # type: ignore[operator]
                raise ValueError(f"CurriculumSampler.phases[{i}]: until_step must increase")
        self._by_id = {t.id: t for t in self.tasks}
        self._by_difficulty: dict[Hashable, list[Task]] = {}
        if self.phases:
            for t in self.tasks:
                if DIFFICULTY_KEY not in t.info:
                    raise ValueError(f"CurriculumSampler: task {t.id} has no info['{DIFFICULTY_KEY}']")
                self._by_difficulty.setdefault(t.info[DIFFICULTY_KEY], []).append(t)
            for i, phase in enumerate(self.phases):
                unknown = [d for d in phase.mix if d not in self._by_difficulty]
                if unknown:
                    raise ValueError(
                        f"CurriculumSampler.phases[{i}].mix names difficulties no task has: {unknown}; "
                        f"tasks have {sorted(self._by_difficulty, key=str)}"
                    )

    def phase_at(self, step: int) -> Phase | None:
        for phase in self.phases:
            if phase.until_step is None or step < phase.until_step:
                return phase
        return None

    def active(self) -> list[Task]:
        return [t for t in self.tasks if t.id not in self.dropped]

    def sample(self, step: int, n: int, rng: random.Random) -> list[Task]:
        """``n`` tasks for ``step``: exact mix counts, without repeats while a bucket has enough tasks."""
        if n < 1:
            raise ValueError(f"sample: n must be >= 1, got {n}")
        if not self.active():
            raise CurriculumExhaustedError(
                f"all {len(self.tasks)} tasks were dropped ({self._drop_summary()}); add harder or easier tasks, "
                "or set drop_solved/drop_unsolved=False"
            )
        phase = self.phase_at(step)
        if phase is None:
            return _draw(self.active(), n, rng)
        pools = {d: [t for t in self._by_difficulty[d] if t.id not in self.dropped] for d in phase.mix}
        ratios = {d: r for d, r in phase.mix.items() if pools[d] and r > 0}
        if not ratios:  # every difficulty of this phase is used up: fall back to what remains
            return _draw(self.active(), n, rng)
        out: list[Task] = []
        for difficulty, count in _apportion(ratios, n).items():
            out += _draw(pools[difficulty], count, rng)
        rng.shuffle(out)
        return out

    def update(self, task_id: str, rewards: Sequence[float]) -> None:
        """Feed back one group's rewards for ``task_id``; may drop the task."""
        if task_id not in self._by_id:
            raise KeyError(f"update: unknown task id {task_id!r}")
        if not rewards:
            return
        stats = self._stats.setdefault(task_id, _TaskStats())
        stats.groups += 1
        solved = all(r >= self.solved_at for r in rewards)
        unsolved = all(r <= self.unsolved_at for r in rewards)
        stats.solved_streak = stats.solved_streak + 1 if solved else 0
        stats.unsolved_streak = stats.unsolved_streak + 1 if unsolved else 0
        if self.drop_solved and stats.solved_streak >= self.patience:
            self.dropped[task_id] = "solved"
        elif self.drop_unsolved and stats.unsolved_streak >= self.patience:
            self.dropped[task_id] = "unsolved"

    def metrics(self) -> dict[str, float]:
        """For the trainer's log: tasks left and dropped."""
        reasons = list(self.dropped.values())
        return {
            "curriculum/active_tasks": float(len(self.tasks) - len(self.dropped)),
            "curriculum/dropped_solved": float(reasons.count("solved")),
            "curriculum/dropped_unsolved": float(reasons.count("unsolved")),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "dropped": dict(self.dropped),
            "stats": {k: [s.groups, s.solved_streak, s.unsolved_streak] for k, s in self._stats.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = [k for k in [*state["dropped"], *state["stats"]] if k not in self._by_id]
        if unknown:
            raise ValueError(f"load_state_dict: the state names tasks this sampler does not have: {unknown[:5]}")
        self.dropped = dict(state["dropped"])
        self._stats = {k: _TaskStats(*v) for k, v in state["stats"].items()}

    def _drop_summary(self) -> str:
        m = self.metrics()
        return f"{m['curriculum/dropped_solved']:.0f} solved, {m['curriculum/dropped_unsolved']:.0f} unsolved"


def _apportion(ratios: Mapping[Hashable, float], n: int) -> dict[Hashable, int]:
    """Split n by ratios with the largest-remainder method (exact totals; ties go to the earlier key)."""
    total = sum(ratios.values())
    quotas = {d: n * r / total for d, r in ratios.items()}
    counts = {d: int(q) for d, q in quotas.items()}
    order = sorted(quotas, key=lambda d: -(quotas[d] - counts[d]))  # stable: earlier keys win ties
    for d in order[: n - sum(counts.values())]:
        counts[d] += 1
    return counts


def _draw(pool: Sequence[Task], count: int, rng: random.Random) -> list[Task]:
    """``count`` tasks from ``pool``: without replacement, cycling through reshuffled copies if it is short."""
    out: list[Task] = []
    while len(out) < count:
        out += rng.sample(list(pool), min(len(pool), count - len(out)))
    return out
