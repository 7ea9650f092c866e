"""One owner for the reward: a ``Rubric`` declares it, ``score`` turns an episode's measurements into it.

A ``Rubric`` lists weighted terms (each with the function that measures it), unweighted measurements, derived
terms (computed from measurements at the training clock: Context-1's F_β with its annealed β), group terms,
gates and the Context-1 clamp. Envs and rollouts only measure, knowing nothing of training:
``env.reward(trajectory)`` returns unweighted values (``rubric.measure``, ``ToolEnv``'s default), kept in
``Trajectory.terms``. ``score(trajectories, rubric, clock)`` writes ``Trajectory.rewards`` from them, applying
once and in this order: term weights at the clock, derived terms, group terms, the clamp, gates (a cheat scores
exactly like a failure), the invalid-call cap. The trainer, ``taskrl eval``, the Ray actors and ``taskrl rewards
score`` all call it, so one trajectory gets one reward everywhere; ``batch_metrics`` is the one aggregator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from taskrl.algos.schedules import Schedule, make_schedule
from taskrl.hooks import declared
from taskrl.types import Task, Trajectory

INVALID_CALL_CAP = "invalid_tool_call_cap"
"""The cap term that keeps an episode with an invalid tool call at or below ``failure_reward``."""
CLAMP = "clamp"
"""The Context-1 clamp's adjustment term."""
CAP_SUFFIX = "_cap"
"""A gate's adjustment term is ``<gate>_cap``."""
ClockKind = Literal["step", "epoch"]
TermFn = Callable[[Trajectory, "Task | None"], "float | None"]
"""Measures one term of an episode: ``f(trajectory, task) -> float | None`` (None: not applicable, excluded from
sums and means, never zero). It may carry ``value_range = (lo, hi)``."""
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


def _check_name(name: str, what: str) -> None:
    if not name or not isinstance(name, str) or "/" in name:
        raise ValueError(f"{what} name must be a non-empty string without '/', got {name!r}")


def _check_clock(kind: str, what: str) -> None:
    if kind not in ("step", "epoch"):
        raise ValueError(f"{what}: clock must be 'step' or 'epoch', got {kind!r}")


@dataclass(frozen=True)
class TermWeight:
    """One weighted term: its name, the function that measures it, its weight and the clock its schedule runs on."""

    name: str
    """Key in ``Trajectory.terms``/``rewards`` and in the logs."""
    weight: float | dict[str, Any] | Schedule = 1.0
    """A number or a schedule spec (constant/linear/cosine/piecewise/step)."""
    clock: ClockKind = "step"
    """What drives the schedule: trainer steps or epochs."""
    fn: TermFn | GroupFn | None = None
    """An episode term's ``TermFn`` (``Rubric.measure`` calls it; None: the env's ``reward`` measures the term
    itself); a group term's ``GroupFn`` over all K samples of a task (required)."""

    def __post_init__(self) -> None:
        _check_name(self.name, "TermWeight")
        _check_clock(self.clock, f"TermWeight '{self.name}'")
        if self.fn is not None and not callable(self.fn):
            raise ValueError(f"TermWeight '{self.name}': fn must be callable, got {type(self.fn).__name__}")


@dataclass(frozen=True)
class Measure:
    """An unweighted measurement ``Rubric.measure`` records in ``Trajectory.terms`` (an input of a derived term,
    a diagnostic): never a reward term itself."""

    name: str
    fn: TermFn

    def __post_init__(self) -> None:
        _check_name(self.name, "Measure")
        if not callable(self.fn):
            raise ValueError(f"Measure '{self.name}': fn must be callable, got {type(self.fn).__name__}")


@dataclass(frozen=True)
class DerivedTerm:
    """A term computed by ``score`` at the clock from measurements: ``fn(*inputs, param)`` with ``param`` read
    from its schedule (Context-1's F_β = ``f_beta(precision, recall, β)``, β annealed by epoch). The env measures
    the inputs only, so an episode is scored at the clock of the batch it is scored in, never at the clock some
    other batch left behind. None when any input is None."""

    name: str
    inputs: tuple[str, ...]
    """Names of ``Rubric.measures`` passed to ``fn`` in this order."""
    fn: Callable[..., float]
    """``fn(*input_values, param) -> float``; may carry ``value_range``."""
    param: float | dict[str, Any] | Schedule = 1.0
    """A number or a schedule spec over ``param_clock`` (Context-1's β)."""
    param_clock: ClockKind = "step"
    """What drives the ``param`` schedule."""
    weight: float | dict[str, Any] | Schedule = 1.0
    """The term's weight (a number or schedule spec over ``clock``)."""
    clock: ClockKind = "step"

    def __post_init__(self) -> None:
        _check_name(self.name, "DerivedTerm")
        _check_clock(self.clock, f"DerivedTerm '{self.name}'")
        _check_clock(self.param_clock, f"DerivedTerm '{self.name}'.param_clock")
        if not self.inputs or not callable(self.fn):
            raise ValueError(f"DerivedTerm '{self.name}': needs inputs and a callable fn")

    def param_at(self, clock: Clock) -> float:
        return float(make_weight(self.param, field=f"DerivedTerm '{self.name}'.param")(clock.at(self.param_clock)))


@dataclass(frozen=True)
class GateRule:
    """An episode whose ``terms[name]`` (measured by ``check``) is below ``min_value`` scores as a failure
    (None: not applicable, passes)."""

    name: str
    min_value: float = 1.0
    check: TermFn | None = None
    """Measures the gate's value (``Rubric.measure``); None: the env's ``reward`` measures it itself."""

    def __post_init__(self) -> None:
        _check_name(self.name, "GateRule")
        if self.check is not None and not callable(self.check):
            raise ValueError(f"GateRule '{self.name}': check must be callable")


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
    """An env's reward, declared: weighted terms with their measuring functions, measurements, derived terms,
    group terms, gates, clamp and failure reward. ``measure`` gives an episode's unweighted values; ``score``
    turns them into its reward at a clock. Presets (``taskrl.rewards.presets``) return one.

    Terms the rubric does not list weigh ``default_weight``; an env without a rubric gets ``Rubric()`` (every
    measured term at weight 1, which is how envs that return final terms keep their totals).
    """

    terms: Sequence[TermWeight] = ()
    """The per-episode weighted terms."""
    measures: Sequence[Measure] = ()
    """Unweighted measurements kept in ``Trajectory.terms`` (derived terms' inputs)."""
    derived: Sequence[DerivedTerm] = ()
    """Terms ``score`` computes from measurements at the clock."""
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
        self.measures, self.derived = list(self.measures), list(self.derived)
        names = [t.name for t in [*self.terms, *self.measures, *self.derived, *self.group_terms]]
        names += [n for g in self.gates for n in (g.name, g.name + CAP_SUFFIX)]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Rubric: term names must be unique, repeated: {duplicates}")
        for t in self.group_terms:
            if t.fn is None:
                raise ValueError(f"Rubric: group term '{t.name}' needs fn")
        measured = {m.name for m in self.measures}
        for d in self.derived:
            missing = [name for name in d.inputs if name not in measured]
            if missing:
                raise ValueError(f"Rubric: derived term '{d.name}' reads {missing}, which are not in measures")
            d.param_at(Clock())  # a bad schedule spec fails here, naming the field
        self._schedules = {
            t.name: (make_weight(t.weight, field=f"Rubric term '{t.name}'.weight"), t.clock)
            for t in [*self.terms, *self.derived, *self.group_terms]
        }
        self.failure_reward = float(self.failure_reward)

    def measure(self, trajectory: Trajectory, task: Task | None = None) -> dict[str, float | None]:
        """An episode's unweighted values: every term with a ``fn``, every measurement and every gate with a
        ``check``, validated (``check_value``). Clock-free: what an env's ``reward`` returns."""
        out: dict[str, float | None] = {}
        for name, fn in [*((t.name, t.fn) for t in self.terms), *((m.name, m.fn) for m in self.measures),
                         *((g.name, g.check) for g in self.gates)]:  # fmt: skip
            if fn is not None:
                out[name] = check_value(name, fn, fn(trajectory, task))
        return out

    def params(self, clock: Clock) -> dict[str, float]:
        """Each derived term's parameter at ``clock`` (Context-1's β), for the logs."""
        return {d.name: d.param_at(clock) for d in self.derived}

    def weights(self, clock: Clock) -> dict[str, float]:
        """The weight of every listed term at ``clock``."""
        return {name: float(schedule(clock.at(kind))) for name, (schedule, kind) in self._schedules.items()}

    @property
    def unweighted(self) -> frozenset[str]:
        """Measured names that are no reward term: gate checks and measurements."""
        return frozenset([*(g.name for g in self.gates), *(m.name for m in self.measures)])


def _total(values: Mapping[str, float | None]) -> float:
    return float(sum(v for v in values.values() if v is not None))


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

    ``reward_weights`` multiply the rubric's weights (a number, or a schedule over ``clock.step``); derived terms
    are computed at ``clock`` and written to ``terms``; group terms are computed for every ``group_id`` with two
    samples or more, in the order given (``task_of`` maps a task id to its Task).
    """
    weights = rubric.weights(clock)
    for name, extra in (reward_weights or {}).items():
        factor = float(extra(clock.step)) if callable(extra) else float(extra)
        weights[name] = weights.get(name, rubric.default_weight) * factor
    skipped = rubric.unweighted | {d.name for d in rubric.derived} | {t.name for t in rubric.group_terms}
    params = rubric.params(clock)
    weighted_by_id: dict[str, dict[str, float | None]] = {}
    for traj in trajectories:  # 1. the measured terms at their weights, then the derived terms at the clock
        weighted: dict[str, float | None] = {}
        for name, value in traj.terms.items():
            if name in skipped or name == INVALID_CALL_CAP:
                continue
            weighted[name] = None if value is None else weights.get(name, rubric.default_weight) * value
        for derived in rubric.derived:
            inputs = [traj.terms.get(name) for name in derived.inputs]
            value = None if any(v is None for v in inputs) else derived.fn(*inputs, params[derived.name])
            traj.terms[derived.name] = check_value(derived.name, derived.fn, value)
            weighted[derived.name] = None if value is None else weights[derived.name] * float(value)
        weighted_by_id[traj.id] = weighted
    if rubric.group_terms:  # 2. group terms, per group of samples of one task (infra failures are no samples)
        for traj in trajectories:
            if traj.infra_failure is not None:
                traj.terms.update(dict.fromkeys((term.name for term in rubric.group_terms), None))
        for group in _groups(trajectories).values():
            if len(group) < 2:
                continue
            task = task_of(group[0].task_id) if task_of is not None else None
            for term in rubric.group_terms:
                assert term.fn is not None
                values = list(term.fn(group, task))  # type: ignore[arg-type]
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
        cap_invalid_calls(traj, weighted, floor)  # 5. an invalid tool call never beats a failure
        traj.rewards = weighted


def rescore(
    trajectories: Sequence[Trajectory],
    rubric: Rubric,
    clock: Clock,
    *,
    task_of: Callable[[str], Task | None] | None = None,
) -> None:
    """Measure saved trajectories again with ``rubric`` (its terms replace ``terms``) and ``score`` them at
    ``clock``: what another reward, or the same one later in its annealing, would have said about them."""
    for traj in trajectories:
        traj.terms = rubric.measure(traj, task_of(traj.task_id) if task_of is not None else None)
    score(trajectories, rubric, clock, task_of=task_of)


def _groups(trajectories: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """The samples of each task (``group_id``); infrastructure failures say nothing of the policy: left out."""
    groups: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        if traj.infra_failure is None:
            groups.setdefault(_group_key(traj), []).append(traj)
    return groups


def cap_invalid_calls(trajectory: Trajectory, weighted: dict[str, float | None], failure_reward: float) -> None:
    """The one invalid-call cap: an episode with an invalid tool call totals at most ``failure_reward``. Replaces
    any earlier cap in ``weighted`` (run last, after every other term)."""
    weighted.pop(INVALID_CALL_CAP, None)
    total = _total(weighted)
    if trajectory.metrics.get("invalid_tool_calls", 0) > 0 and total > failure_reward:
        weighted[INVALID_CALL_CAP] = failure_reward - total


MeasureFn = Callable[[int, list[Trajectory]], None]
"""Extra measurements over a batch: ``fn(step, trajectories)`` adds terms (reward models, shaping) to each
trajectory's ``terms`` in place; writing ``rewards`` (which ``score`` overwrites) is refused."""


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


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
    gets one reward in both): ``measure``, then ``score`` at ``clock``. ``rubric`` defaults to ``env``'s
    (``rubric_of``; ``env`` may be None when ``rubric`` is given); the env is told nothing about the clock."""
    rubric = rubric if rubric is not None else rubric_of(env)
    if measure is not None:
        before = [dict(traj.rewards) for traj in trajectories]
        measure(clock.step, trajectories)
        for traj, rewards in zip(trajectories, before, strict=True):
            changed = sorted(k for k in {*traj.rewards, *rewards} if not _same(traj.rewards.get(k), rewards.get(k)))
            if changed:
                raise RewardTermError(
                    f"score_fn wrote Trajectory.rewards {changed}: write measurements to Trajectory.terms instead "
                    "(taskrl.scoring.score weighs them, 1 unless the rubric lists them, and writes rewards itself)"
                )
    # one order however the episodes finished, so order-dependent group terms agree
    ordered = sorted(trajectories, key=lambda t: (t.seed if t.seed is not None else -1, t.id))
    score(ordered, rubric, clock, reward_weights=reward_weights, task_of=task_of)


def rubric_of(env: Any) -> Rubric:
    """The env's declared ``rubric``, or ``Rubric(failure_reward=env.failure_reward)`` when it declares none."""
    rubric = declared(env, "rubric")
    return rubric if rubric is not None else Rubric(failure_reward=float(declared(env, "failure_reward")))


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def batch_metrics(
    trajectories: Sequence[Trajectory], rubric: Rubric | None = None, clock: Clock | None = None
) -> dict[str, float]:
    """The one aggregator of a batch, in one namespace, for the trainer's log, ``taskrl eval``, ``taskrl rollout``
    and ``taskrl rewards score``: ``rewards/total`` and ``rewards/std``, per term the weighted mean
    ``rewards/<term>``, its share ``rewards/applicable/<term>`` and the measured mean ``rewards_raw/<term>``, with a
    rubric and clock ``rewards/weight/<term>`` and each derived term's ``rewards/param/<term>`` (Context-1's β);
    ``tools/*`` per-episode means, ``charts/*`` counts and shares. A term never applicable in the batch is left
    out. ``rewards/total`` and ``rewards/std`` leave out infrastructure failures (``Trajectory.infra_failure``),
    counted in ``charts/infra_failures``."""
    rewards = [t.reward for t in trajectories if t.infra_failure is None]  # infra failures are no scores
    mean = _mean(rewards)
    out: dict[str, float] = {
        "rewards/total": mean,
        "rewards/std": math.sqrt(_mean([(r - mean) ** 2 for r in rewards])) if rewards else float("nan"),
        "charts/episodes": float(len(trajectories)),
        "charts/sampled_tokens": float(sum(t.num_sampled_tokens for t in trajectories)),
        "charts/mean_tokens": _mean([float(t.num_tokens) for t in trajectories]),
        "charts/mean_sampled_tokens": _mean([float(t.num_sampled_tokens) for t in trajectories]),
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
        out.update({f"rewards/param/{name}": p for name, p in rubric.params(clock).items()})
    for name in ("tool_calls", "invalid_tool_calls", "tool_errors", "tool_cost", "turns", "capped_turns"):
        out[f"tools/{name}"] = _mean([t.metrics.get(name, 0.0) for t in trajectories])
    return out
