"""Composed rewards: named terms with scheduled weights, gates that score cheats as failures, stage-wise credit.

A term is a plain function ``f(trajectory, task) -> float | None`` (None = not applicable: excluded, not zero).
Use one as an env's reward the way the search, code and swarm envs use their presets: ``reward`` returns
``composed.measure(trajectory, task)`` (the UNWEIGHTED terms and gate checks) and the env declares
``rubric = composed.rubric()``, so ``taskrl.scoring.score`` applies weights, group terms, clamp, gates and the
invalid-call cap, once; forward the env's ``set_step`` to it when a term has its own schedule (Context-1's β).
``ComposedReward(terms)(trajectory, task)`` returns the WEIGHTED terms (``evaluate``, through the same ``score``)
and records each unweighted value in ``trajectory.metrics["reward_raw/<name>"]``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from taskrl.algos.schedules import Schedule
from taskrl.scoring import INVALID_CALL_CAP as INVALID_CALL_CAP  # the one invalid-call cap lives in taskrl.scoring
from taskrl.scoring import ClampRule, Clock, GateRule, Rubric, TermWeight, check_value, is_adjustment, score
from taskrl.scoring import RewardTermError as RewardTermError  # one error type and validator for every term
from taskrl.scoring import make_weight as make_weight
from taskrl.types import Task, Trajectory

Term = Callable[[Trajectory, "Task | None"], "float | None"]
"""A reward term: ``f(trajectory, task) -> float | None``. It may carry ``value_range = (lo, hi)``."""
GroupTerm = Callable[[Sequence[Trajectory], "Task | None"], "Sequence[float | None]"]
"""A term that needs the whole group of K samples of one task (exploration, agreement): one value each."""


class ScheduledTerm(abc.ABC):
    """Base of a term whose value follows the reward's clock (Context-1's annealed β): the composed reward calls
    ``set_step(step, epoch)`` on it before scoring. Plain functions and other terms have no schedule."""

    @abc.abstractmethod
    def set_step(self, step: int, epoch: int = 0) -> None:
        """Move the term's schedule to ``step`` / ``epoch``."""


RAW_PREFIX = "reward_raw/"
"""``trajectory.metrics`` key prefix of the unweighted term values."""


@dataclass
class RewardClock:
    """The training position that drives weight schedules; shared by every reward that holds it."""

    step: int = 0
    """Trainer update step."""
    epoch: int = 0
    """Pass over the task set (Context-1 anneals beta between epochs)."""

    def set(self, step: int, epoch: int = 0) -> None:
        if step < 0 or epoch < 0:
            raise ValueError(f"step and epoch must be >= 0, got step={step}, epoch={epoch}")
        self.step, self.epoch = int(step), int(epoch)

    def at(self, clock: Literal["step", "epoch"]) -> int:
        return self.epoch if clock == "epoch" else self.step


def _check_name(name: str, what: str) -> None:
    if not name or not isinstance(name, str) or "/" in name:
        raise ValueError(f"{what} name must be a non-empty string without '/', got {name!r}")


@dataclass
class WeightedTerm:
    """One named term of a composed reward."""

    name: str
    """Key in ``Trajectory.rewards`` and in the logs."""
    fn: Term
    """The term function; a ``GroupTerm`` when used in ``ComposedReward.group_terms``."""
    weight: float | dict[str, Any] | Schedule = 1.0
    """A number or a schedule spec (constant/linear/cosine/piecewise/step) over ``clock``."""
    clock: Literal["step", "epoch"] = "step"
    """What drives the weight schedule: trainer steps or epochs."""
    schedule: Schedule = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_name(self.name, "WeightedTerm")
        if not callable(self.fn):
            raise ValueError(f"WeightedTerm '{self.name}': fn must be callable, got {type(self.fn).__name__}")
        if self.clock not in ("step", "epoch"):
            raise ValueError(f"WeightedTerm '{self.name}': clock must be 'step' or 'epoch', got {self.clock!r}")
        self.schedule = make_weight(self.weight, field=f"WeightedTerm '{self.name}'.weight")


@dataclass
class Gate:
    """A check that makes the episode score as a failure when it does not pass (fabricated answer, tampering)."""

    name: str
    """The cap term is logged as ``<name>_cap`` (how much the gate removed); the check as ``reward_raw/<name>``."""
    check: Term
    """Returns a value per episode; None means not applicable (the gate passes)."""
    min_value: float = 1.0
    """The check passes when its value is >= this."""

    def __post_init__(self) -> None:
        _check_name(self.name, "Gate")
        if not callable(self.check):
            raise ValueError(f"Gate '{self.name}': check must be callable")


@dataclass(frozen=True)
class PenaltyClamp:
    """Context-1's clamp(total, ε, r_pre): cap at the pre-penalty reward (the positive terms), floor a completed
    episode (final answer, no error) at ε and any other at 0; see ``formulas.context1_clamp``."""

    epsilon: float = 0.01
    """Floor for an episode that completed without error."""

    def __post_init__(self) -> None:
        if not (0.0 <= self.epsilon < 1.0):
            raise ValueError(f"PenaltyClamp.epsilon must be in [0, 1), got {self.epsilon}")


@dataclass
class RewardBreakdown:
    """One scored episode: unweighted values, weighted values (the reward terms) and the weights used."""

    raw: dict[str, float | None]
    weighted: dict[str, float | None]
    weights: dict[str, float]

    @property
    def total(self) -> float:
        return float(sum(v for v in self.weighted.values() if v is not None))


class ComposedReward:
    """Weighted named terms, group terms, gates and an optional Context-1 clamp: a ``measure`` and a ``rubric``,
    scored by ``taskrl.scoring.score`` in its order (weights, group terms, clamp, gates, invalid-call cap).

    When a gate fails, ``<gate>_cap`` brings the total down to ``failure_reward``, so a cheat scores exactly like
    a failed episode and the log shows why. ``group_terms`` need all K samples of a task: an env declaring
    ``rubric()`` gets them from ``score``; the legacy ``finalize_group`` hook adds them to a collected group.
    """

    def __init__(
        self,
        terms: Sequence[WeightedTerm],
        *,
        group_terms: Sequence[WeightedTerm] = (),
        gates: Sequence[Gate] = (),
        clamp: PenaltyClamp | None = None,
        failure_reward: float = 0.0,
        clock: RewardClock | None = None,
    ) -> None:
        self.terms = list(terms)
        self.group_terms = list(group_terms)
        self.gates = list(gates)
        self.clamp = clamp
        self.failure_reward = float(failure_reward)
        self.clock = clock if clock is not None else RewardClock()  # its own: no process-wide clock exists
        names = [t.name for t in self.terms + self.group_terms] + [
            n for g in self.gates for n in (g.name, f"{g.name}_cap")
        ]
        names += ["clamp"] if clamp else []
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"ComposedReward: term names must be unique, repeated: {duplicates}")
        if not self.terms and not self.group_terms:
            raise ValueError("ComposedReward needs at least one term")

    def set_step(self, step: int, epoch: int = 0) -> None:
        """Move this reward's clock to ``step``/``epoch`` (the rollout tells every env, and the env its reward,
        the batch's ``taskrl.scoring.Clock`` through this hook; rewards that share a given clock move together),
        and the terms with schedules of their own with it (Context-1's β)."""
        self.clock.set(step, epoch)
        self._sync_terms()

    def measure(self, trajectory: Trajectory, task: Task | None = None) -> dict[str, float | None]:
        """What an env's ``reward`` returns when this is its reward: every per-episode term and every gate's
        check, UNWEIGHTED (terms with schedules at this reward's clock); ``taskrl.scoring.score`` with
        ``self.rubric()`` turns them into the same reward ``evaluate`` gives (group terms included)."""
        self._sync_terms()
        raw = self.raw_values(trajectory, task)
        for gate in self.gates:
            raw[gate.name] = check_value(gate.name, gate.check, gate.check(trajectory, task))
        return raw

    def rubric(self, *, group_terms: bool = True) -> Rubric:
        """This reward as a ``taskrl.scoring.Rubric``: the same term names, weights (schedules and clocks),
        group terms, gates, clamp and failure reward; what an env that measures with ``measure`` declares.
        ``group_terms=False``: the per-episode part only (``evaluate``; ``finalize_group`` adds the rest)."""
        groups = self.group_terms if group_terms else []
        return Rubric(
            terms=[TermWeight(t.name, t.schedule, t.clock) for t in self.terms],
            group_terms=[TermWeight(t.name, t.schedule, t.clock, fn=t.fn) for t in groups],  # type: ignore[arg-type]
            gates=[GateRule(g.name, g.min_value) for g in self.gates],
            clamp=ClampRule(self.clamp.epsilon) if self.clamp is not None else None,
            failure_reward=self.failure_reward,
        )

    def weights(self) -> dict[str, float]:
        """Current weight of every term and group term (for logging annealing)."""
        return {t.name: float(t.schedule(self.clock.at(t.clock))) for t in self.terms + self.group_terms}

    def _sync_terms(self) -> None:
        # Terms with their own schedules (Context-1's beta) follow the same clock as the weights.
        for t in self.terms + self.group_terms:
            if isinstance(t.fn, ScheduledTerm):
                t.fn.set_step(self.clock.step, self.clock.epoch)

    def raw_values(self, trajectory: Trajectory, task: Task | None) -> dict[str, float | None]:
        """Unweighted value of every (per-episode) term."""
        return {t.name: check_value(t.name, t.fn, t.fn(trajectory, task)) for t in self.terms}

    def evaluate(self, trajectory: Trajectory, task: Task | None = None) -> RewardBreakdown:
        """Score one episode without touching it: ``measure``, then ``taskrl.scoring.score`` with ``rubric()`` at
        this reward's clock, on a copy without the loop's metrics (so without the invalid-call cap, which
        ``rescore`` and the loop apply)."""
        raw = self.measure(trajectory, task)
        copy = dataclasses.replace(trajectory, terms=dict(raw), rewards={}, metrics={})
        score([copy], self.rubric(group_terms=False), Clock(self.clock.step, self.clock.epoch))
        return RewardBreakdown(raw, copy.rewards, self.weights())

    def __call__(self, trajectory: Trajectory, task: Task | None = None) -> dict[str, float | None]:
        """The weighted terms for ``Trajectory.rewards``; unweighted values go to ``trajectory.metrics``."""
        breakdown = self.evaluate(trajectory, task)
        record_raw(trajectory, breakdown.raw)
        return breakdown.weighted

    def finalize_group(self, trajectories: Sequence[Trajectory], task: Task | None = None) -> None:
        """Score ``trajectories`` as ONE group of samples of ``task`` (the legacy hook for envs that keep this
        reward's weighted terms in ``rewards``), through ``taskrl.scoring.score``: each episode's terms measured
        again (pure functions of trajectory and task), other reward keys kept as they are, the group terms over
        the group (two samples or more), then clamp, gates and the invalid-call cap. Group values also go to
        ``metrics["reward_raw/<name>"]``."""
        if not self.group_terms or not trajectories:
            return
        own = {t.name for t in self.terms + self.group_terms} | {g.name for g in self.gates}
        probes = []
        for traj in trajectories:
            kept = {k: v for k, v in traj.rewards.items() if k not in own and not is_adjustment(k)}
            terms = {**kept, **self.measure(traj, task)}
            probes.append(dataclasses.replace(traj, group_id="group", terms=terms, rewards={}))
        score(probes, self.rubric(), Clock(self.clock.step, self.clock.epoch), task_of=lambda _: task)
        for traj, probe in zip(trajectories, probes, strict=True):
            traj.rewards = probe.rewards
            record_raw(traj, {t.name: probe.terms.get(t.name) for t in self.group_terms})

    def rescore(self, trajectories: Sequence[Trajectory], task_of: Callable[[str], Task | None]) -> None:
        """Score finished trajectories again in place (e.g. read back from JSONL) the way training scores them:
        ``measure`` each into ``terms`` (unweighted values also in ``metrics["reward_raw/<name>"]``), then
        ``taskrl.scoring.score`` with ``rubric()`` at this reward's clock: group terms per ``group_id`` (two
        samples or more), clamp, gates, the invalid-call cap. ``task_of`` maps a task id to its Task."""
        for traj in trajectories:
            traj.terms, traj.rewards = self.measure(traj, task_of(traj.task_id)), {}
        score(trajectories, self.rubric(), Clock(self.clock.step, self.clock.epoch), task_of=task_of)
        for traj in trajectories:
            record_raw(traj, traj.terms)


def record_raw(trajectory: Trajectory, raw: dict[str, float | None]) -> None:
    """Write unweighted values into ``trajectory.metrics`` (None = not applicable is left out)."""
    for name, value in raw.items():
        if value is not None:
            trajectory.metrics[RAW_PREFIX + name] = value


@dataclass
class Stage:
    """One stage of a multi-stage task (design / implement / verify) with its own verifier."""

    name: str
    """Term name of the stage's credit."""
    verifier: Term
    """Scores the stage in [0, 1]; None if the stage does not apply to this task."""
    weight: float | dict[str, Any] | Schedule = 1.0
    """Share of the reward this stage earns (the seed: 0.2 / 0.5 / 0.3); may be a schedule."""

    def __post_init__(self) -> None:
        _check_name(self.name, "Stage")
        if not callable(self.verifier):
            raise ValueError(f"Stage '{self.name}': verifier must be callable, got {type(self.verifier).__name__}")


class MultiStageReward(ComposedReward):
    """Stage-wise credit: each stage's verifier scores it, weighted by the stage weight.

    With ``sequential=True`` a stage earns nothing (and its verifier is not run) once an earlier applicable
    stage scored below ``pass_threshold``: tests written for a design that failed earn no credit.
    ``extra_terms`` (auxiliary, anti-cheating) are scored after the stages.
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        *,
        sequential: bool = False,
        pass_threshold: float = 1.0,
        extra_terms: Sequence[WeightedTerm] = (),
        **kwargs: Any,
    ) -> None:
        if not stages:
            raise ValueError("MultiStageReward needs at least one stage")
        if not 0.0 <= pass_threshold <= 1.0:
            raise ValueError(f"MultiStageReward.pass_threshold must be in [0, 1], got {pass_threshold}")
        self.stages = list(stages)
        self.sequential = sequential
        self.pass_threshold = pass_threshold
        stage_terms = [WeightedTerm(s.name, s.verifier, s.weight) for s in self.stages]
        super().__init__([*stage_terms, *extra_terms], **kwargs)

    def raw_values(self, trajectory: Trajectory, task: Task | None) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        blocked = False
        for stage in self.stages:
            if blocked:
                out[stage.name] = 0.0
                continue
            value = check_value(stage.name, stage.verifier, stage.verifier(trajectory, task))
            if value is not None and not 0.0 <= value <= 1.0:
                raise RewardTermError(f"stage '{stage.name}' verifier returned {value}; stages score in [0, 1]")
            out[stage.name] = value
            blocked = self.sequential and value is not None and value < self.pass_threshold
        stage_names = {s.name for s in self.stages}
        extra = [t for t in self.terms if t.name not in stage_names]
        out.update({t.name: check_value(t.name, t.fn, t.fn(trajectory, task)) for t in extra})
        return out


def reward_metrics(trajectories: Sequence[Trajectory], reward: ComposedReward | None = None) -> dict[str, float]:
    """Batch means for the run log, one per term: ``rewards/<term>`` (weighted), ``rewards_raw/<term>``
    (unweighted), ``rewards/applicable/<term>`` (share of episodes where it applied), ``rewards/total``, and
    with ``reward`` its current ``rewards/weight/<term>``. A term never applicable in the batch is left out."""
    out: dict[str, float] = {}
    if trajectories:
        out["rewards/total"] = sum(t.reward for t in trajectories) / len(trajectories)
    for name in sorted({k for t in trajectories for k in t.rewards}):
        values = [t.rewards[name] for t in trajectories if t.rewards.get(name) is not None]
        if values:
            out[f"rewards/{name}"] = float(sum(values)) / len(values)  # type: ignore[arg-type]
            out[f"rewards/applicable/{name}"] = len(values) / len(trajectories)
    for key in sorted({k for t in trajectories for k in t.metrics if k.startswith(RAW_PREFIX)}):
        values = [t.metrics[key] for t in trajectories if key in t.metrics]
        out[f"rewards_raw/{key.removeprefix(RAW_PREFIX)}"] = sum(values) / len(values)
    if reward is not None:
        out.update({f"rewards/weight/{name}": w for name, w in reward.weights().items()})
    return out
