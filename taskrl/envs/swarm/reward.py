"""The swarm reward: r = r_perf + λ1·r_parallel + λ2·r_finish + λ3·r_efficiency (docs/design/index.md §7), λ1, λ2
annealed to 0.

Built on the reward toolkit's ``parl`` preset, which pays for useful parallelism only (``taskrl.rewards.parl``:
distinct sub-tasks whose answers fill a correct row, overlapping on the step clock; critical steps in the
unannealed efficiency term); r_perf is the task's own score (item F1 for wide search, all branches right for deep
search). The λ annealing runs on the clock ``taskrl.scoring.score`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from taskrl.envs.swarm.tasks import task_performance
from taskrl.rewards.presets import parl
from taskrl.scoring import Rubric
from taskrl.types import Task, Trajectory


@dataclass(frozen=True)
class SwarmRewardConfig:
    """Weights and annealing of PARL's auxiliary terms."""

    lambda_parallel: float = 0.3
    """λ1, initial weight of r_parallel (annealed to 0)."""
    lambda_finish: float = 0.2
    """λ2, initial weight of r_finish (annealed to 0)."""
    lambda_efficiency: float = 0.1
    """λ3, constant weight of r_efficiency = r_perf · (1 − critical steps / budget) · useful share (not annealed)."""
    critical_steps_budget: int = 100
    """Critical steps at which r_efficiency reaches 0 (the env's ``max_critical_steps`` replaces it when set)."""
    k: int = 4
    """Useful sub-tasks running at once that earn full parallel credit (fewer when the task has fewer rows)."""
    anneal_steps: int = 1000
    """Trainer steps over which λ1 and λ2 go to 0."""
    anneal: Literal["linear", "cosine"] = "linear"
    """Shape of the annealing."""

    def __post_init__(self) -> None:
        if self.lambda_parallel < 0 or self.lambda_finish < 0 or self.lambda_parallel + self.lambda_finish >= 1:
            raise ValueError(
                f"SwarmRewardConfig.lambda_parallel ({self.lambda_parallel}) and lambda_finish ({self.lambda_finish}) "
                "must be >= 0 and sum to less than 1, or spawning empty sub-agents could beat an honest solve"
            )
        if not 0 <= self.lambda_efficiency < 1:
            raise ValueError(f"SwarmRewardConfig.lambda_efficiency must be in [0, 1), got {self.lambda_efficiency}")
        if self.critical_steps_budget < 1:
            raise ValueError(
                f"SwarmRewardConfig.critical_steps_budget must be >= 1, got {self.critical_steps_budget}"
            )
        if self.k < 1:
            raise ValueError(f"SwarmRewardConfig.k must be >= 1, got {self.k}")
        if self.anneal_steps < 1:
            raise ValueError(f"SwarmRewardConfig.anneal_steps must be >= 1, got {self.anneal_steps}")
        if self.anneal not in ("linear", "cosine"):
            raise ValueError(f"SwarmRewardConfig.anneal must be 'linear' or 'cosine', got {self.anneal!r}")


@dataclass(frozen=True)
class TaskPerformance:
    """r_perf: the swarm task's own score of the final answer; 0 when the episode did not end with an answer."""

    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        if task is None:
            return None
        return task_performance(task, trajectory.final_answer) if trajectory.terminated else 0.0


def swarm_reward(config: SwarmRewardConfig, budget: int | None = None) -> Rubric:
    """PARL's rubric with r_perf = ``TaskPerformance`` (terms: perf, parallel, finish, efficiency);
    ``budget`` (the env's critical-steps budget) replaces ``config.critical_steps_budget`` when given."""
    return parl(
        TaskPerformance(),
        k=config.k,
        lambda_parallel=config.lambda_parallel,
        lambda_finish=config.lambda_finish,
        lambda_efficiency=config.lambda_efficiency,
        critical_steps_budget=budget or config.critical_steps_budget,
        anneal_steps=config.anneal_steps,
        anneal=config.anneal,
    )
