"""Reward presets named after their sources: ``context1``, ``parl``, ``seed_weighted``, ``composer``.

Each returns a ``taskrl.scoring.Rubric`` (terms with their measuring functions, every term logged apart; weight
schedules and Context-1's β run on the ``Clock`` that ``taskrl.scoring.score`` is given, never on the env's);
``PRESETS`` maps the names to the builders. The Context-1 term classes
live here too because only that recipe defines them; their ``trajectory.info``/``task.info`` keys are listed in
``context1``'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from taskrl.algos.schedules import Schedule
from taskrl.rewards.cheating import BusyWork, Grounding, TrivialTests
from taskrl.rewards.formulas import (
    answer_correct,
    doc_of,
    f_beta,
    f_beta_sets,
    fact_recall,
    output_precision,
    prune_penalty,
    turn_penalty,
)
from taskrl.rewards.parl import CriticalEfficiency, UsefulFinish, UsefulParallelism
from taskrl.rewards.terms import (
    AnswerMatch,
    EffortPenalty,
    OutputAgreement,
    RecordedTests,
    Untampered,
    ValidToolUse,
)
from taskrl.rewards.views import assistant_turns, tool_exchanges
from taskrl.scoring import ClampRule, DerivedTerm, GateRule, Measure, Rubric, TermFn, TermWeight
from taskrl.types import Task, Trajectory

# Keys the Context-1 terms read: task keys as ``taskrl datagen multihop`` writes them; trajectory keys as the
# search env writes them (``encountered_chunk_ids``, ``output_doc_ids``, ``answer_line``), else the older
# chunk-level keys.
OUTPUT_DOCS = "output_doc_ids"
OUTPUT_CHUNKS = "output_chunks"
SEEN_CHUNKS = ("encountered_chunk_ids", "seen_chunks")
ANSWER_LINE = "answer_line"
FACTS = "facts"
RELEVANT_CHUNKS = "relevant_chunks"
ANSWER_CHUNKS = "answer_chunk_ids"


def _ids(mapping: Mapping[str, Any], key: str | tuple[str, ...]) -> set[Hashable] | None:
    """The ids under ``key``, or under the first of several keys that is present."""
    for name in (key,) if isinstance(key, str) else key:
        if name in mapping:
            value = mapping[name]
            return None if value is None else set(value)
    return None


def _fact_chunks(task: Task | None) -> list[set[Hashable]] | None:
    """Gold facts, each as the set of chunks that support it (``info["facts"][i]["chunk_ids"]``); a plain
    ``info["relevant_chunks"]`` list is one fact per chunk."""
    if task is None:
        return None
    if task.info.get(FACTS) is not None:
        return [set(fact["chunk_ids"]) for fact in task.info[FACTS]]
    relevant = _ids(task.info, RELEVANT_CHUNKS)
    return None if relevant is None else [{c} for c in relevant]


def output_precision_recall(
    trajectory: Trajectory, task: Task | None, max_output_docs: int = 10
) -> tuple[float, float] | None:
    """Context-1's precision and fact-level recall of the final output, the inputs of its F_β (None without gold
    facts). Over the documents it lists (``info["output_doc_ids"]``, as the search env writes it): a fact is
    recalled when the first ``max_output_docs`` listed documents include one holding a chunk that supports it;
    precision is the share of listed documents holding a supporting or answer chunk. Over chunks
    (``info["output_chunks"]``) when an env records those instead (nothing listed when nothing is relevant: 1, 1)."""
    facts = _fact_chunks(task)
    if facts is None:
        return None
    assert task is not None
    supporting = set().union(*facts) | (_ids(task.info, ANSWER_CHUNKS) or set())
    if OUTPUT_DOCS in trajectory.info:
        listed = list(trajectory.info[OUTPUT_DOCS] or [])
        recall = fact_recall(facts, found_docs=listed[:max_output_docs])
        return output_precision(listed, {doc_of(c) for c in supporting}), recall
    output = _ids(trajectory.info, OUTPUT_CHUNKS) or set()
    if not facts:
        return f_beta_sets(output, set(), 1.0)[1:]
    recall = fact_recall(facts, found_chunks=output)
    return (len(output & supporting) / len(output) if output else 0.0), recall


@dataclass(frozen=True)
class OutputPrecision:
    """The precision input of Context-1's F_β (``output_precision_recall``)."""

    max_output_docs: int = 10
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        both = output_precision_recall(trajectory, task, self.max_output_docs)
        return None if both is None else both[0]


@dataclass(frozen=True)
class OutputRecall:
    """The fact-level recall input of Context-1's F_β (``output_precision_recall``)."""

    max_output_docs: int = 10
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        both = output_precision_recall(trajectory, task, self.max_output_docs)
        return None if both is None else both[1]


def output_f_beta(
    beta: float | dict[str, Any] | Schedule | None = None,
    *,
    weight: float = 1.0,
    beta_clock: Literal["step", "epoch"] = "epoch",
    max_output_docs: int = 10,
) -> tuple[list[Measure], DerivedTerm]:
    """Context-1's F_β on the final output: the env measures ``output_precision`` and ``output_recall``;
    ``taskrl.scoring.score`` derives ``f_beta`` = ``formulas.f_beta(precision, recall, β)`` with β read from its
    schedule at the clock it scores at (default: 4 -> 2 linear over 4 epochs)."""
    if max_output_docs < 1:
        raise ValueError(f"context1: max_output_docs must be >= 1, got {max_output_docs}")
    if beta is None:
        beta = {"kind": "linear", "start": 4.0, "end": 2.0, "steps": 4}
    measures = [Measure("output_precision", OutputPrecision(max_output_docs)),
                Measure("output_recall", OutputRecall(max_output_docs))]  # fmt: skip
    derived = DerivedTerm("f_beta", ("output_precision", "output_recall"), f_beta, param=beta,
                          param_clock=beta_clock, weight=weight)  # fmt: skip
    return measures, derived


@dataclass(frozen=True)
class TrajectoryRecall:
    """Context-1's r_traj: recall of the gold facts over every chunk the agent encountered, pruned included."""

    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        facts = _fact_chunks(task)
        if not facts:
            return None
        return fact_recall(facts, found_chunks=_ids(trajectory.info, SEEN_CHUNKS) or set())


@dataclass(frozen=True)
class AnswerFound:
    """Context-1's r_fa: 1 when a chunk containing the answer was retrieved at any point, else 0."""

    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        answer_chunks = _ids(task.info, ANSWER_CHUNKS) if task is not None else None
        if answer_chunks is None:
            return None
        return float(bool(answer_chunks & (_ids(trajectory.info, SEEN_CHUNKS) or set())))


@dataclass(frozen=True)
class AnswerCorrect:
    """The search env's optional answer term (off in pure Context-1): 1 when the ``ANSWER:`` line the env
    recorded (``info["answer_line"]``, None without one) equals ``task.info["answer"]`` (``formulas.answer_correct``:
    case, spaces and edge punctuation ignored; a list of guesses is wrong). None when either is not recorded."""

    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        if task is None or task.info.get("answer") is None or ANSWER_LINE not in trajectory.info:
            return None
        return float(answer_correct(trajectory.info[ANSWER_LINE], str(task.info["answer"])))


def _streaks(names: Iterable[str], tool: str) -> list[int]:
    out, run = [], 0
    for name in names:
        if name == tool:
            run += 1
        elif run:
            out.append(run)
            run = 0
    return [*out, run] if run else out


@dataclass(frozen=True)
class PrunePenalty:
    """Context-1's p_prune, negated: ``per_call`` (0.1) per ``prune_chunks`` call beyond a consecutive streak of
    ``free_streak`` (3), capped at ``cap`` (0.5). Consecutive = in call order, across turns; calls that never ran
    (invalid) are left out, any other call ends the streak."""

    tool: str = "prune_chunks"
    """Name of the pruning tool."""
    per_call: float = 0.1
    """Cost of each prune call beyond the free streak."""
    free_streak: int = 3
    """Consecutive prune calls that cost nothing."""
    cap: float = 0.5
    """Most the penalty can take."""

    def __post_init__(self) -> None:
        prune_penalty((), free_streak=self.free_streak, per_call=self.per_call, cap=self.cap)  # validates them

    @property
    def value_range(self) -> tuple[float, float]:
        return (-self.cap, 0.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        names = [e.call.name for e in tool_exchanges(trajectory) if not e.is_invalid]
        penalty = prune_penalty(_streaks(names, self.tool), free_streak=self.free_streak, per_call=self.per_call,
                                cap=self.cap)  # fmt: skip
        return 0.0 - penalty  # 0.0 - x, not -x: no "-0.0" in logs


@dataclass(frozen=True)
class TurnPenalty:
    """Context-1's p_turn, negated: linear from 0 at ``start`` assistant turns to ``max_penalty`` (0.5) at ``end``."""

    start: int = 64
    """Turns that cost nothing."""
    end: int = 128
    """Turns at which the full penalty is reached."""
    max_penalty: float = 0.5
    """The penalty at and beyond ``end``."""

    def __post_init__(self) -> None:
        turn_penalty(0, start=self.start, end=self.end, max_penalty=self.max_penalty)  # validates them

    @property
    def value_range(self) -> tuple[float, float]:
        return (-self.max_penalty, 0.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        penalty = turn_penalty(assistant_turns(trajectory), start=self.start, end=self.end,
                               max_penalty=self.max_penalty)  # fmt: skip
        return 0.0 - penalty


def context1(
    *,
    beta: float | dict[str, Any] | Schedule | None = None,
    epsilon: float = 0.01,
    f_beta_weight: float = 0.7,
    trajectory_recall_weight: float = 0.3,
    answer_found_weight: float = 1.0,
    answer_weight: float = 0.0,
    max_output_docs: int = 10,
    prune: PrunePenalty | None = None,
    turns: TurnPenalty | None = None,
) -> Rubric:
    """Chroma Context-1 (Chroma's Context-1 technical report): r = clamp(0.7·F_β + 0.3·r_traj + r_fa − p_prune −
    p_turn, ε, r_pre), β = 4 annealed toward 2 between epochs (default: linear over 4 epochs). See
    docs/design/index.md §6.
    ``answer_weight`` > 0 adds ``answer_correct`` (the ANSWER line equals the task's answer; off = pure Context-1).

    F_β is a derived term (``output_f_beta``): the env measures precision and recall, ``score`` computes F_β at
    its clock. This is the search env's reward: ``SearchEnv`` builds it from its ``RewardConfig`` and declares it
    as its rubric. Reads what the search env writes:
    ``trajectory.info["output_doc_ids"]`` (documents the final output lists), ``["encountered_chunk_ids"]``
    (every chunk returned to the agent, pruned included) and ``["answer_line"]``; or, from other envs,
    ``["output_chunks"]`` and ``["seen_chunks"]``; and the task as ``taskrl datagen multihop`` writes it:
    ``task.info["facts"][i]["chunk_ids"]`` (or a flat ``["relevant_chunks"]``), ``["answer_chunk_ids"]`` and
    ``["answer"]``.
    """
    measures, fbeta = output_f_beta(beta, weight=f_beta_weight, max_output_docs=max_output_docs)
    terms = [
        TermWeight("trajectory_recall", trajectory_recall_weight, fn=TrajectoryRecall()),
        TermWeight("answer_found", answer_found_weight, fn=AnswerFound()),
    ]
    if answer_weight > 0:
        terms.append(TermWeight("answer_correct", answer_weight, fn=AnswerCorrect()))
    terms += [
        TermWeight("prune_penalty", 1.0, fn=prune or PrunePenalty()),
        TermWeight("turn_penalty", 1.0, fn=turns or TurnPenalty()),
    ]
    return Rubric(terms=terms, measures=measures, derived=[fbeta], clamp=ClampRule(epsilon))


def _anneal(start: float, steps: int, kind: str, end: float = 0.0) -> dict[str, Any]:
    if kind not in ("linear", "cosine"):
        raise ValueError(f"anneal must be 'linear' or 'cosine', got {kind!r}")
    if steps < 1:
        raise ValueError(f"anneal_steps must be >= 1, got {steps}")
    return {"kind": kind, "start": start, "end": end, "steps": steps}


def parl(
    perf: TermFn | None = None,
    *,
    k: int = 4,
    lambda_parallel: float = 0.3,
    lambda_finish: float = 0.2,
    lambda_efficiency: float = 0.1,
    critical_steps_budget: int = 100,
    anneal_steps: int = 1000,
    anneal: Literal["linear", "cosine"] = "linear",
) -> Rubric:
    """Kimi K2.5 PARL (Moonshot AI's Kimi K2.5 technical report, Agent Swarm): r = r_perf + λ1·r_parallel +
    λ2·r_finish, λ1 and λ2 annealed to 0 over ``anneal_steps`` trainer steps, plus our unannealed λ3·r_efficiency.

    Kimi published no closed forms; ours pay for useful parallelism only (``taskrl.rewards.parl``,
    docs/design/swarm.md): r_parallel = min(1, distinct useful sub-tasks running at one step / min(K, task size));
    r_finish = distinct useful sub-tasks / max(assignments, sub-agents created); r_efficiency = r_perf · (1 −
    critical steps / budget) · useful share (critical steps enter the reward, as Kimi trains under a critical-step
    budget). Truncated episodes earn no auxiliary credit. ``perf`` defaults to exact match.
    """
    if not (lambda_parallel >= 0 and lambda_finish >= 0 and lambda_parallel + lambda_finish < 1):
        raise ValueError(
            f"parl: lambda_parallel ({lambda_parallel}) and lambda_finish ({lambda_finish}) must be >= 0 "
            "and sum to less than 1, or spawning empty sub-agents could beat an honest solve"
        )
    if not 0 <= lambda_efficiency < 1:
        raise ValueError(f"parl: lambda_efficiency must be in [0, 1), got {lambda_efficiency}")
    perf = perf or AnswerMatch()
    terms = [
        TermWeight("perf", 1.0, fn=perf),
        TermWeight("parallel", _anneal(lambda_parallel, anneal_steps, anneal), fn=UsefulParallelism(k)),
        TermWeight("finish", _anneal(lambda_finish, anneal_steps, anneal), fn=UsefulFinish()),
        TermWeight("efficiency", lambda_efficiency, fn=CriticalEfficiency(perf, critical_steps_budget)),
    ]
    return Rubric(terms=terms)


def seed_weighted(
    completion: TermFn | None = None,
    *,
    k: int = 4,
    efficiency_anneal_steps: int = 1000,
    busy_work_weight: float = 0.3,
    grounding: Grounding | None = None,
) -> Rubric:
    """The seed's multi-objective reward (seed article 004 §3.1-3.2, on Kimi K2.5): completion 40%, parallel
    efficiency 30% annealed linearly to 5%, output stability 30%; with the seed's anti-cheating terms: fake
    parallelism earns no efficiency (PARL's ``UsefulParallelism``, as the default swarm reward: distinct useful
    sub-tasks overlapping on the critical-step clock, never wall-clock time), busy-work is penalised
    (``BusyWork``), and a fabricated answer (``Grounding`` < 1) scores as a failure.

    Output stability is a GROUP term (agreement of the K samples' answers): ``taskrl.scoring.score`` adds it per
    group of samples of a task. ``completion`` defaults to exact match of the final answer.
    """
    if busy_work_weight < 0:
        raise ValueError(f"seed_weighted: busy_work_weight must be >= 0, got {busy_work_weight}")
    terms = [
        TermWeight("completion", 0.4, fn=completion or AnswerMatch()),
        TermWeight("efficiency", _anneal(0.3, efficiency_anneal_steps, "linear", end=0.05), fn=UsefulParallelism(k)),
        TermWeight("busy_work", busy_work_weight, fn=BusyWork()),
    ]
    gates = [GateRule("grounding", check=grounding or Grounding())]
    return Rubric(terms=terms, group_terms=[TermWeight("stability", 0.3, fn=OutputAgreement())], gates=gates)


def composer(
    tests: TermFn | None = None,
    *,
    valid_tool_use_weight: float = 0.1,
    valid_tool_use_counts_errors: bool = False,
    effort: EffortPenalty | None = None,
    effort_weight: float = 0.1,
    trivial_tests_weight: float = 0.5,
    tamper_key: str = "tests_tampered",
    tamper_metric: str = "tampering",
    tamper_gate: bool = True,
    floor_at_failure: bool = False,
) -> Rubric:
    """Cursor Composer 2 (Cursor's Composer 2 technical report): hidden tests + valid tool use + effort
    penalty ((1+k·x)^(1-q)-1)/(k·(1-q)) (default k=1, q=2 over tool calls: bounded by 1), with Cursor's
    anti-hacking: tampering (the code env's ``trajectory.metrics["tampering"]``, or an env's
    ``info[tamper_key]``) scores as a failure, "no tests collected" scores 0, and generated tests are penalised
    by how little they cover (``TrivialTests``, reading ``trajectory.info["test_coverage"]``). ``tests``
    defaults to ``RecordedTests()``: the code env's verified ``metrics["tests_passed"]``, else pass/total counts.

    ``valid_tool_use_counts_errors`` pays the valid-tool-use credit only for calls that also ran without an
    error result (``ValidToolUse.count_errors``). A term at weight 0 is off (not a term at all).
    ``tamper_gate=False`` leaves the gate out, for an env whose tests term is already 0 on tampering and that
    pays nothing else (the code env without valid-tool-use credit); ``floor_at_failure`` floors the total at 0
    (Context-1's clamp with ε = 0): the penalties never take an episode below a failure, the code env's reading
    of its effort penalty. This is the code env's reward: ``CodeEnv`` builds it from its ``CodeRewardConfig``
    and declares its rubric.
    """
    for name, value in (("valid_tool_use_weight", valid_tool_use_weight), ("effort_weight", effort_weight),
                        ("trivial_tests_weight", trivial_tests_weight)):  # fmt: skip
        if value < 0:
            raise ValueError(f"composer: {name} must be >= 0, got {value}")
    terms = [
        TermWeight("tests", 1.0, fn=tests or RecordedTests()),
        TermWeight("valid_tool_use", valid_tool_use_weight, fn=ValidToolUse(count_errors=valid_tool_use_counts_errors)),
        TermWeight("effort", effort_weight, fn=effort or EffortPenalty()),
        TermWeight("trivial_tests", trivial_tests_weight, fn=TrivialTests()),
    ]
    terms = [t for t in terms if t.name == "tests" or t.weight != 0]
    gates = [GateRule("tests_intact", check=Untampered(tamper_metric, tamper_key))] if tamper_gate else []
    clamp = ClampRule(0.0) if floor_at_failure else None
    return Rubric(terms=terms, gates=gates, clamp=clamp)


PRESETS: dict[str, Callable[..., Rubric]] = {
    "context1": context1,
    "parl": parl,
    "seed_weighted": seed_weighted,
    "composer": composer,
}


def make_reward(name: str, **kwargs: Any) -> Rubric:
    """Build a preset by name (for configs); an unknown name lists the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown reward preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name](**kwargs)
