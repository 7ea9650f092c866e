"""One owner for the reward: ``score`` turns an episode's measured terms into its training reward.

Envs and rollouts only measure: ``env.reward(trajectory)`` returns unweighted values, kept in
``Trajectory.terms``. ``score(trajectories, rubric, clock)`` writes ``Trajectory.rewards`` from them, applying
once and in this order: term weights at the clock, group terms, the Context-1 clamp, gates (a cheat scores
exactly like a failure), the invalid-call cap. The trainer, ``taskrl eval``, the Ray actors and ``taskrl rewards
score`` all call it, so one trajectory gets one reward everywhere; ``batch_metrics`` is the one aggregator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from taskrl.algos.schedules import Schedule, make_schedule
from taskrl.hooks import call_hook, declared
from taskrl.types import Task, Trajectory

INVALID_CALL_CAP = "invalid_tool_call_cap"
"""The cap term that keeps an episode with an invalid tool call at or below ``failure_reward``."""
CLAMP = "clamp"
"""The Context-1 clamp's adjustment term."""
CAP_SUFFIX = "_cap"
"""A gate's adjustment term is ``<gate>_cap``."""
ClockKind = Literal["step", "epoch"]
GroupFn = Callable[[Sequence[Trajectory], "Task | None"], "Sequence[float | None]"]
"""A group term: all K samples of one task in, one value (or None) per sample out."""


class RewardTermError(ValueError):
    """A term returned something other than a finite float in its documented range, or None."""


@dataclass(frozen=True)
class Clock:
    """The training position every weight schedule reads: passed as an argument, never a global."""

    step: int = 0
    """Trainer update step."""
    epoch: int = 0
    """Pass over the task set (Context-1 anneals beta between epochs)."""

    def __post_init__(self) -> None:
        if self.step < 0 or self.epoch < 0:
            raise ValueError(f"Clock: step and epoch must be >= 0, got step={self.step}, epoch={self.epoch}")

    def at(self, kind: ClockKind) -> int:
        return self.epoch if kind == "epoch" else self.step


def make_weight(spec: float | dict[str, Any] | Schedule, *, field: str) -> Schedule:
    """A weight schedule: a number, a ``{"kind": constant|linear|cosine|piecewise|step, ...}`` dict, or a
    schedule. ``step`` is an alias of ``piecewise`` (values change at the boundaries)."""
    if isinstance(spec, dict) and spec.get("kind") == "step":
        spec = {**spec, "kind": "piecewise"}
    return make_schedule(spec, field=field)


def check_value(name: str, fn: Any, value: Any) -> float | None:
    """Validate a term's output: None, or a finite float inside ``fn.value_range`` when it declares one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardTermError(f"term '{name}' returned {type(value).__name__} {value!r}; return a float or None")
    value = float(value)
    if not math.isfinite(value):
        raise RewardTermError(f"term '{name}' returned {value}; return a finite float, or None if not applicable")
    low, high = getattr(fn, "value_range", (-math.inf, math.inf))
    if not (low - 1e-9 <= value <= high + 1e-9):
        raise RewardTermError(f"term '{name}' returned {value}, outside its documented range [{low}, {high}]")
    return value


@dataclass(frozen=True)
class TermWeight:
    """The weight of one measured term (or group term) and the clock its schedule runs on."""

    name: str
    weight: float | dict[str, Any] | Schedule = 1.0
    """A number or a schedule spec (constant/linear/cosine/piecewise/step)."""
    clock: ClockKind = "step"
    """What drives the schedule: trainer steps or epochs."""
    fn: GroupFn | None = None
    """Only for group terms: computes the term over a group of samples."""


@dataclass(frozen=True)
class GateRule:
    """An episode whose measured ``terms[name]`` is below ``min_value`` scores as a failure (None: passes)."""

    name: str
    min_value: float = 1.0


def context1_clamp(total: float, pre_penalty: float, *, epsilon: float, completed: bool) -> float:
    """Context-1's clamp(total, ε, r_pre): capped at the pre-penalty reward r_pre, then floored at ε for an
    episode that completed (final answer, no error) and at 0 otherwise. The floor wins when r_pre < ε, so a
    completed episode always beats a failed one (the search env's reward reads docs/design/index.md §6 the same
    way). ``ClampRule`` applies it in ``score``."""
    return max(epsilon if completed else 0.0, min(total, pre_penalty))


@dataclass(frozen=True)
class ClampRule:
    """Context-1's clamp(total, ε, r_pre): capped at the positive terms' sum, floored at ε when completed."""

    epsilon: float = 0.01
    """Floor for an episode that completed (final answer, no error); others floor at 0."""
    require_terminated: bool = False
    """Completed also needs ``terminated`` (the search env's reading: a truncated answer is no completion)."""

    def __post_init__(self) -> None:
        if not (0.0 <= self.epsilon < 1.0):
            raise ValueError(f"ClampRule.epsilon must be in [0, 1), got {self.epsilon}")

    def completed(self, trajectory: Trajectory) -> bool:
        done = trajectory.final_answer is not None and trajectory.error is None
        return done and (trajectory.terminated or not self.require_terminated)


@dataclass
class Rubric:
    """How an env's measured terms become its reward: weights, group terms, clamp, gates, failure reward.

    Terms the rubric does not list weigh ``default_weight``; an env without a rubric gets ``Rubric()`` (every
    measured term at weight 1, which is how envs that return final terms keep their totals).
    """

    terms: Sequence[TermWeight] = ()
    """Weights of the per-episode measured terms."""
    group_terms: Sequence[TermWeight] = ()
    """Terms over all K samples of a task, each with its ``fn``; added by ``score`` per ``group_id``."""
    gates: Sequence[GateRule] = ()
    """Checks read from the measured terms; a failed one caps the total at ``failure_reward``."""
    clamp: ClampRule | None = None
    """Context-1's clamp, applied after the weighted terms and group terms, before the gates."""
    failure_reward: float = 0.0
    """Reward of a failed episode: no cheat and no invalid call scores above it."""
    default_weight: float = 1.0
    """Weight of a measured term the rubric does not list."""
    _schedules: dict[str, tuple[Schedule, ClockKind]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.terms, self.group_terms, self.gates = list(self.terms), list(self.group_terms), list(self.gates)
        names = [t.name for t in [*self.terms, *self.group_terms]]
        names += [n for g in self.gates for n in (g.name, g.name + CAP_SUFFIX)]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Rubric: term names must be unique, repeated: {duplicates}")
        for t in self.group_terms:
            if t.fn is None:
                raise ValueError(f"Rubric: group term '{t.name}' needs fn")
        self._schedules = {
            t.name: (make_weight(t.weight, field=f"Rubric term '{t.name}'.weight"), t.clock)
            for t in [*self.terms, *self.group_terms]
        }
        self.failure_reward = float(self.failure_reward)

    def weights(self, clock: Clock) -> dict[str, float]:
        """The weight of every listed term at ``clock``."""
        return {name: float(schedule(clock.at(kind))) for name, (schedule, kind) in self._schedules.items()}

    @property
    def gate_names(self) -> frozenset[str]:
        return frozenset(g.name for g in self.gates)


def _total(values: Mapping[str, float | None]) -> float:
    return float(sum(v for v in values.values() if v is not None))


def measured_terms(trajectory: Trajectory) -> dict[str, float | None]:
    """``trajectory.terms``; a trajectory scored before terms existed (schema v1, or built by hand with only
    ``rewards``) has its reward terms read as weight-1 measurements, the invalid-call cap left for ``score``."""
    if trajectory.terms or not trajectory.rewards:
        return trajectory.terms
    trajectory.terms = {k: v for k, v in trajectory.rewards.items() if k != INVALID_CALL_CAP}
    return trajectory.terms


def _group_key(trajectory: Trajectory) -> str:
    return trajectory.group_id if trajectory.group_id is not None else trajectory.id


def score(
    trajectories: Sequence[Trajectory],
    rubric: Rubric,
    clock: Clock,
    *,
    reward_weights: Mapping[str, float | Schedule] | None = None,
    task_of: Callable[[str], Task | None] | None = None,
) -> None:
    """Write each trajectory's ``rewards`` from its measured ``terms`` (idempotent: a re-score gives the same).

    ``reward_weights`` multiply the rubric's weights (a number, or a schedule over ``clock.step``); group terms
    are computed for every ``group_id`` with two samples or more (``task_of`` maps a task id to its Task).
    """
    weights = rubric.weights(clock)
    for name, extra in (reward_weights or {}).items():
        factor = float(extra(clock.step)) if callable(extra) else float(extra)
        weights[name] = weights.get(name, rubric.default_weight) * factor
    gates = rubric.gate_names
    weighted_by_id: dict[str, dict[str, float | None]] = {}
    legacy_failed: dict[str, list[str]] = {}
    for traj in trajectories:  # 1. the measured terms at their weights
        weighted: dict[str, float | None] = {}
        failed: list[str] = []
        for name, value in measured_terms(traj).items():
            if name in gates or name == INVALID_CALL_CAP:
                continue
            if name.endswith(CAP_SUFFIX) and name not in weights:  # a gate verdict of an env without a rubric
                weighted[name] = None if value is None else 0.0
                if value is not None and value < -1e-12:
                    failed.append(name)
                continue
            weighted[name] = None if value is None else weights.get(name, rubric.default_weight) * value
        weighted_by_id[traj.id], legacy_failed[traj.id] = weighted, failed
    if rubric.group_terms:  # 2. group terms, per group of samples of one task (infra failures are no samples)
        groups: dict[str, list[Trajectory]] = {}
        for traj in trajectories:
            if traj.infra_failure is None:
                groups.setdefault(_group_key(traj), []).append(traj)
            else:
                traj.terms.update(dict.fromkeys((term.name for term in rubric.group_terms), None))
        for group in groups.values():
            if len(group) < 2:
                continue
            task = task_of(group[0].task_id) if task_of is not None else None
            for term in rubric.group_terms:
                assert term.fn is not None
                values = list(term.fn(group, task))
                if len(values) != len(group):
                    raise RewardTermError(
                        f"group term '{term.name}' returned {len(values)} values for {len(group)} trajectories"
                    )
                for traj, value in zip(group, values, strict=True):
                    traj.terms[term.name] = check_value(term.name, term.fn, value)
        for traj in trajectories:
            for term in rubric.group_terms:
                value = traj.terms.get(term.name)
                weighted_by_id[traj.id][term.name] = None if value is None else weights[term.name] * value
    floor = rubric.failure_reward
    for traj in trajectories:
        weighted = weighted_by_id[traj.id]
        if rubric.clamp is not None:  # 3. the clamp
            total = _total(weighted)
            pre_penalty = float(sum(v for v in weighted.values() if v is not None and v > 0))
            clamped = context1_clamp(total, pre_penalty, epsilon=rubric.clamp.epsilon,
                                     completed=rubric.clamp.completed(traj))  # fmt: skip
            weighted[CLAMP] = clamped - total
        for gate in rubric.gates:  # 4. gates: a cheat scores exactly like a failure
            value = traj.terms.get(gate.name)
            if value is None:
                weighted[gate.name + CAP_SUFFIX] = None
                continue
            total = _total(weighted)
            weighted[gate.name + CAP_SUFFIX] = floor - total if value < gate.min_value and total > floor else 0.0
        for name in legacy_failed[traj.id]:
            total = _total(weighted)
            weighted[name] = floor - total if total > floor else 0.0
        cap_invalid_calls(traj, weighted, floor)  # 5. an invalid tool call never beats a failure
        traj.rewards = weighted


def cap_invalid_calls(trajectory: Trajectory, weighted: dict[str, float | None], failure_reward: float) -> None:
    """The one invalid-call cap: an episode with an invalid tool call totals at most ``failure_reward``. Replaces
    any earlier cap in ``weighted`` (run last, after every other term)."""
    weighted.pop(INVALID_CALL_CAP, None)
    total = _total(weighted)
    if trajectory.metrics.get("invalid_tool_calls", 0) > 0 and total > failure_reward:
        weighted[INVALID_CALL_CAP] = failure_reward - total


def is_adjustment(name: str) -> bool:
    """A term ``score`` writes itself (clamp, gate caps, the invalid-call cap), never a measurement."""
    return name in (CLAMP, INVALID_CALL_CAP) or name.endswith(CAP_SUFFIX)


MeasureFn = Callable[[int, list[Trajectory]], None]
"""Extra measurements over a batch: ``fn(step, trajectories)`` adds terms (reward models, shaping) in place."""


def score_collected(
    trajectories: list[Trajectory],
    env: Any,
    clock: Clock,
    *,
    rubric: Rubric | None = None,
    reward_weights: Mapping[str, float | Schedule] | None = None,
    task_of: Callable[[str], Task | None] | None = None,
    measure: MeasureFn | None = None,
) -> None:
    """The one scoring path of a collected batch, shared by the trainer and ``taskrl eval`` (so one trajectory
    gets one reward in both): the env's legacy ``finalize_group`` hook per group of two samples or more (after
    ``set_step`` at ``clock``; an env forwards both to the reward objects it holds), ``measure``, then ``score``.

    ``env`` is a probe env of the run, used only for its hooks and rubric; ``rubric`` defaults to its rubric.
    """
    rubric = rubric if rubric is not None else rubric_of(env)
    for traj in trajectories:
        measured_terms(traj)  # hand-built or schema-1 trajectories: their reward terms are the measurements
    finalize = declared(env, "finalize_group")
    groups: dict[str, list[Trajectory]] = {}
    for traj in trajectories:  # an infrastructure failure says nothing of the policy: no member of its group
        if traj.infra_failure is None:
            groups.setdefault(_group_key(traj), []).append(traj)
    for group in groups.values():  # one order however the episodes finished: order-dependent hooks agree
        group.sort(key=lambda t: (t.seed if t.seed is not None else -1, t.id))
    if finalize is not None and any(len(g) > 1 for g in groups.values()):
        call_hook(env, "set_step", clock.step, clock.epoch)  # the group terms' weights at this batch's clock
        for group in groups.values():
            if len(group) > 1:
                finalize(group, task_of(group[0].task_id) if task_of is not None else None)
    if measure is not None:
        measure(clock.step, trajectories)
    for traj in trajectories:  # reward keys a hook added (measure, a legacy finalize_group) are measurements
        for name, value in traj.rewards.items():
            if not is_adjustment(name):
                traj.terms.setdefault(name, value)
    score(trajectories, rubric, clock, reward_weights=reward_weights, task_of=task_of)


def rubric_of(env: Any) -> Rubric:
    """The env's declared ``rubric``, or ``Rubric(failure_reward=env.failure_reward)`` when it declares none."""
    rubric = declared(env, "rubric")
    return rubric if rubric is not None else Rubric(failure_reward=float(declared(env, "failure_reward")))


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def batch_metrics(
    trajectories: Sequence[Trajectory], rubric: Rubric | None = None, clock: Clock | None = None
) -> dict[str, float]:
    """The one aggregator of a batch, in one namespace: ``rewards/total`` and ``rewards/std``, per term the
    weighted mean ``rewards/<term>``, its share ``rewards/applicable/<term>`` and the measured mean
    ``rewards_raw/<term>``, with a rubric and clock ``rewards/weight/<term>``; ``tools/*`` and ``charts/*``
    per episode. A term never applicable in the batch is left out. ``rewards/total`` and ``rewards/std`` leave
    out infrastructure failures (``Trajectory.infra_failure``), counted in ``charts/infra_failures``."""
    rewards = [t.reward for t in trajectories if t.infra_failure is None]  # infra failures are no scores
    mean = _mean(rewards)
    out: dict[str, float] = {
        "rewards/total": mean,
        "rewards/std": math.sqrt(_mean([(r - mean) ** 2 for r in rewards])) if rewards else float("nan"),
        "charts/episodes": float(len(trajectories)),
        "charts/sampled_tokens": float(sum(t.num_sampled_tokens for t in trajectories)),
        "charts/terminated": _mean([float(t.terminated) for t in trajectories]),
        "charts/truncated": _mean([float(t.truncated) for t in trajectories]),
        "charts/errors": float(sum(t.error is not None for t in trajectories)),
        "charts/infra_failures": float(sum(t.infra_failure is not None for t in trajectories)),
        "charts/cut_by_max_new_tokens": _mean([float(t.info.get("truncation") == "max_new_tokens")
                                               for t in trajectories]),  # fmt: skip
    }
    for name in sorted({k for t in trajectories for k in t.rewards}):
        values = [v for t in trajectories if (v := t.rewards.get(name)) is not None]
        if values:
            out[f"rewards/{name}"] = _mean(values)
            out[f"rewards/applicable/{name}"] = len(values) / len(trajectories)
    for name in sorted({k for t in trajectories for k in t.terms}):
        values = [v for t in trajectories if (v := t.terms.get(name)) is not None]
        if values:
            out[f"rewards_raw/{name}"] = _mean(values)
    if rubric is not None and clock is not None:
        out.update({f"rewards/weight/{name}": w for name, w in rubric.weights(clock).items()})
    for name in ("tool_calls", "invalid_tool_calls", "tool_errors", "tool_cost", "turns"):
        out[f"tools/{name}"] = _mean([t.metrics.get(name, 0.0) for t in trajectories])
    return out
