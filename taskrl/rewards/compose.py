"""Stage-wise credit as a ``Rubric`` (``multi_stage``), and the errors that name what replaced the removed
reward types (``ComposedReward``, ``WeightedTerm``, ``Gate``, ... : one vocabulary now lives in ``taskrl.scoring``).

A term is a plain function ``f(trajectory, task) -> float | None`` (``taskrl.scoring.TermFn``; None = not
applicable: excluded, not zero). Declare an env's reward as a ``taskrl.scoring.Rubric`` (or take a preset from
``taskrl.rewards.presets``); its ``reward`` returns ``rubric.measure(trajectory, task)`` and ``score`` decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from taskrl.algos.schedules import Schedule
from taskrl.scoring import RewardTermError, Rubric, TermFn, TermWeight, check_value
from taskrl.types import Task, Trajectory

Term = TermFn
"""A reward term's measuring function (an alias of ``taskrl.scoring.TermFn``)."""

REMOVED: dict[str, str] = {
    "ComposedReward": "taskrl.scoring.Rubric (terms with their measuring functions; rubric.measure(trajectory, "
                      "task) measures, taskrl.scoring.score(trajectories, rubric, Clock(step, epoch)) scores)",
    "WeightedTerm": "taskrl.scoring.TermWeight(name, weight, clock, fn=term_function)",
    "Gate": "taskrl.scoring.GateRule(name, min_value, check=check_function)",
    "PenaltyClamp": "taskrl.scoring.ClampRule(epsilon)",
    "RewardBreakdown": "score the trajectory with taskrl.scoring.score: trajectory.terms holds the unweighted "
                       "values, trajectory.rewards the weighted ones",
    "RewardClock": "taskrl.scoring.Clock(step, epoch), passed to taskrl.scoring.score",
    "ScheduledTerm": "taskrl.scoring.DerivedTerm (a term computed at the Clock from measurements, with an annealed "
                     "param: Context-1's beta)",
    "MultiStageReward": "taskrl.rewards.compose.multi_stage(stages, ...), which returns a taskrl.scoring.Rubric",
    "reward_metrics": "taskrl.scoring.batch_metrics(trajectories, rubric, clock)",
    "record_raw": "taskrl.scoring.score keeps unweighted values in trajectory.terms",
    "RAW_PREFIX": "trajectory.terms (unweighted values); batch_metrics logs them as rewards_raw/<term>",
    "make_weight": "taskrl.scoring.make_weight",
}  # fmt: skip
"""Names this module no longer has, with their replacements (``__getattr__`` names them on import)."""


class RemovedNameError(ImportError):
    """A removed reward name (raised on import and on attribute access, so its message reaches the user)."""


def removed_name_error(module: str, name: str) -> RemovedNameError:
    return RemovedNameError(f"{module}.{name} was removed (one reward vocabulary, issue 39): use {REMOVED[name]}")


def __getattr__(name: str) -> Any:
    if name in REMOVED:
        raise removed_name_error("taskrl.rewards.compose", name)
    raise AttributeError(f"module 'taskrl.rewards.compose' has no attribute {name!r}")


@dataclass
class Stage:
    """One stage of a multi-stage task (design / implement / verify) with its own verifier."""

    name: str
    """Term name of the stage's credit."""
    verifier: TermFn
    """Scores the stage in [0, 1]; None if the stage does not apply to this task."""
    weight: float | dict[str, Any] | Schedule = 1.0
    """Share of the reward this stage earns (the seed: 0.2 / 0.5 / 0.3); may be a schedule."""

    def __post_init__(self) -> None:
        if not callable(self.verifier):
            raise ValueError(f"Stage '{self.name}': verifier must be callable, got {type(self.verifier).__name__}")


@dataclass(frozen=True)
class _StageCredit:
    """Measures stage ``stages[-1]``: its verifier's score, or 0 (verifier not run) when ``sequential`` and an
    earlier applicable stage scored below ``pass_threshold``. Verifiers are pure functions of (trajectory, task),
    so each stage's measurement runs the earlier verifiers again (stages are few)."""

    stages: tuple[Stage, ...]
    sequential: bool
    pass_threshold: float

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        for i, stage in enumerate(self.stages):
            value = check_value(stage.name, stage.verifier, stage.verifier(trajectory, task))
            if value is not None and not 0.0 <= value <= 1.0:
                raise RewardTermError(f"stage '{stage.name}' verifier returned {value}; stages score in [0, 1]")
            if i == len(self.stages) - 1:
                return value
            if self.sequential and value is not None and value < self.pass_threshold:
                return 0.0
        raise AssertionError("unreachable: stages is never empty")


def multi_stage(
    stages: Sequence[Stage],
    *,
    sequential: bool = False,
    pass_threshold: float = 1.0,
    extra_terms: Sequence[TermWeight] = (),
    **rubric: Any,
) -> Rubric:
    """Stage-wise credit as a ``Rubric``: each stage's verifier scores it, weighted by the stage weight.

    With ``sequential=True`` a stage earns nothing (and its verifier is not run) once an earlier applicable
    stage scored below ``pass_threshold``: tests written for a design that failed earn no credit.
    ``extra_terms`` (auxiliary, anti-cheating) follow the stages; ``rubric`` passes on (gates, clamp, ...).
    """
    if not stages:
        raise ValueError("multi_stage needs at least one stage")
    if not 0.0 <= pass_threshold <= 1.0:
        raise ValueError(f"multi_stage: pass_threshold must be in [0, 1], got {pass_threshold}")
    terms = [
        TermWeight(s.name, s.weight, fn=_StageCredit(tuple(stages[: i + 1]), sequential, pass_threshold))
        for i, s in enumerate(stages)
    ]
    return Rubric(terms=[*terms, *extra_terms], **rubric)
