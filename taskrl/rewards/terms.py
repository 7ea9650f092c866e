"""Outcome and auxiliary reward terms from the recipes: answer match, test pass rate, valid tool use (Cursor),
exploration bonus within a group (Cursor), tool cost and effort penalties (Composer), summary usefulness.

Every term is a small frozen dataclass called as ``term(trajectory, task) -> float | None`` (group terms:
``term(trajectories, task) -> list``) with ``value_range`` declared; penalties are <= 0 so weights stay positive.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from taskrl.rewards.formulas import effort_penalty
from taskrl.rewards.views import assistant_turns, extract_numbers, tool_exchanges
from taskrl.scoring import TermFn
from taskrl.tools import ToolSet
from taskrl.types import Task, Trajectory

NEG_INF_TO_ZERO = (-math.inf, 0.0)
UNIT = (0.0, 1.0)


def _number(text: str) -> float | None:
    cleaned = text.replace(",", "").strip().rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


@dataclass(frozen=True)
class AnswerMatch:
    """1.0 when the final answer matches ``task.answer``, else 0.0; None without a gold answer or final answer.

    ``mode``: ``exact`` (case- and space-insensitive), ``number`` (the last number in the answer equals the
    gold number), ``contains`` (the gold answer appears in the final answer).
    """

    mode: Literal["exact", "number", "contains"] = "exact"
    """How the final answer is compared with the gold answer."""
    value_range: ClassVar[tuple[float, float]] = UNIT

    def __post_init__(self) -> None:
        if self.mode not in ("exact", "number", "contains"):
            raise ValueError(f"AnswerMatch.mode must be exact, number or contains, got {self.mode!r}")

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        answer = trajectory.final_answer
        if task is None or task.answer is None or answer is None:
            return None
        gold = str(task.answer).strip().lower()
        said = " ".join(answer.lower().split())
        if self.mode == "contains":
            return float(gold in said)
        if self.mode == "number":
            numbers = extract_numbers(said, ordered=True)
            gold_number = _number(gold)
            return float(bool(numbers) and gold_number is not None and float(numbers[-1]) == gold_number)
        return float(said == " ".join(gold.split()))


@dataclass(frozen=True)
class TestPassRate:
    """Share of the hidden tests that passed, from ``trajectory.info``; "no tests collected" scores 0.

    Keys (written by the code env): ``tests_passed`` and ``tests_total`` (ints). None when they are absent.
    """

    passed_key: str = "tests_passed"
    """``trajectory.info`` key of the number of passing tests."""
    total_key: str = "tests_total"
    """``trajectory.info`` key of the number of collected tests."""
    value_range: ClassVar[tuple[float, float]] = UNIT
    __test__: ClassVar[bool] = False  # not a pytest test class, despite the name

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        if self.passed_key not in trajectory.info or self.total_key not in trajectory.info:
            return None
        passed, total = int(trajectory.info[self.passed_key]), int(trajectory.info[self.total_key])
        if not 0 <= passed <= max(total, 0):
            raise ValueError(f"trajectory.info: {self.passed_key}={passed} must be in [0, {self.total_key}={total}]")
        return passed / total if total > 0 else 0.0  # SWE-smith #24: nothing collected is a failure, not a pass


CODE_TESTS_KEY = "tests_passed"
"""``trajectory.metrics`` key the code env writes: its verified hidden-test score in [0, 1] (share of fail-to-pass
tests passing times share of pass-to-pass passing; 0 on tampering, no tests collected, errors, timeouts)."""
CODE_TAMPER_KEY = "tampering"
"""``trajectory.metrics`` key the code env writes on every scored episode: 1.0 when it found tampering, else 0.0."""


@dataclass(frozen=True)
class RecordedTests:
    """The hidden-test score an env measured: ``trajectory.metrics["tests_passed"]`` (what the code env writes),
    else ``TestPassRate`` over ``info["tests_passed"]``/``["tests_total"]`` counts; None when neither exists."""

    key: str = CODE_TESTS_KEY
    """``trajectory.metrics`` key of the score in [0, 1]."""
    counts: TestPassRate = field(default_factory=lambda: TestPassRate())
    """The fallback over pass/total counts in ``trajectory.info``."""
    value_range: ClassVar[tuple[float, float]] = UNIT

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        value = trajectory.metrics.get(self.key)
        if value is None:
            return self.counts(trajectory, task)
        value = float(value)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"trajectory.metrics[{self.key!r}] must be a score in [0, 1], got {value}")
        return value


@dataclass(frozen=True)
class Untampered:
    """1.0 when the env found no tampering, 0.0 when it did: ``trajectory.metrics["tampering"]`` (the code env's
    flag), else ``InfoFlag(info_key)``; None when neither is recorded (the gate passes)."""

    key: str = CODE_TAMPER_KEY
    """``trajectory.metrics`` key of the 0/1 tampering flag."""
    info_key: str = "tests_tampered"
    """``trajectory.info`` key of a truthy tamper flag, for envs that record it there."""
    value_range: ClassVar[tuple[float, float]] = UNIT

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        value = trajectory.metrics.get(self.key)
        if value is None:
            return InfoFlag(self.info_key)(trajectory, task)
        return 0.0 if value else 1.0


@dataclass(frozen=True)
class ValidToolUse:
    """Cursor's valid-tool-use reward: the share of tool calls that were valid (parsed, known tool, arguments
    that validate). None for an episode without tool calls. Tool failures at run time are not invalid calls,
    unless ``count_errors``: then only calls that also ran without an error result count (a call on a file
    that does not exist, or a line range outside it, earns nothing). Without it the credit can be farmed with
    well-formed calls that do nothing: GRPO on the code recipe learned ``read_file(path="path")`` from it."""

    count_errors: bool = False
    """Count a call whose result is an error (the tool failed at run time) as not valid."""
    value_range: ClassVar[tuple[float, float]] = UNIT

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        exchanges = tool_exchanges(trajectory)
        if not exchanges:
            return None
        failed = sum(e.is_error if self.count_errors else e.is_invalid for e in exchanges)
        return 1.0 - failed / len(exchanges)


def tool_combination(trajectory: Trajectory, kind: Literal["set", "sequence"] = "set") -> tuple[str, ...]:
    """The tools an episode used: as a sorted set, or as the call order with immediate repeats collapsed."""
    names = [e.call.name for e in tool_exchanges(trajectory) if not e.is_invalid]
    if kind == "set":
        return tuple(sorted(set(names)))
    return tuple(n for i, n in enumerate(names) if i == 0 or names[i - 1] != n)


@dataclass(frozen=True)
class ExplorationBonus:
    """Cursor's fix for over-conservative policies: a bonus for a tool combination the rest of the group did
    not use. A GROUP term: (K - n_same) / (K - 1), where n_same counts the samples (this one included) that
    used the same combination; 1 for a unique combination, 0 when all agree; 0 without tool calls; None for
    a group of one."""

    kind: Literal["set", "sequence"] = "set"
    """Compare the set of tools used, or their order."""
    value_range: ClassVar[tuple[float, float]] = UNIT

    def __post_init__(self) -> None:
        if self.kind not in ("set", "sequence"):
            raise ValueError(f"ExplorationBonus.kind must be 'set' or 'sequence', got {self.kind!r}")

    def __call__(self, trajectories: Sequence[Trajectory], task: Task | None) -> list[float | None]:
        k = len(trajectories)
        if k < 2:
            return [None] * k
        combos = [tool_combination(t, self.kind) for t in trajectories]
        counts = Counter(combos)
        return [(k - counts[c]) / (k - 1) if c else 0.0 for c in combos]


@dataclass(frozen=True)
class ToolCostPenalty:
    """Minus the summed cost of the tool calls that ran (the cost of a tool over-user); 0 without calls."""

    costs: Mapping[str, float] = field(default_factory=dict)
    """Cost per call of each tool (``ToolSet`` costs: ``ToolCostPenalty.from_toolset(env.tools)``)."""
    default_cost: float = 0.0
    """Cost of a tool missing from ``costs``."""
    value_range: ClassVar[tuple[float, float]] = NEG_INF_TO_ZERO

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.costs.items() if not (v >= 0 and math.isfinite(v))}
        if bad or not self.default_cost >= 0:
            raise ValueError(f"ToolCostPenalty costs must be finite and >= 0, got {bad or self.default_cost}")

    @classmethod
    def from_toolset(cls, tools: ToolSet, **kwargs: Any) -> ToolCostPenalty:
        return cls(costs={t.name: t.cost for t in tools}, **kwargs)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        ran = [e for e in tool_exchanges(trajectory) if not e.is_invalid]
        return -float(sum(self.costs.get(e.call.name, self.default_cost) for e in ran))


EffortMeasure = Literal["tool_calls", "turns", "assistant_chars"]


def effort(trajectory: Trajectory, measure: EffortMeasure) -> float:
    """How much work an episode did, by ``measure``."""
    if measure == "tool_calls":
        return float(len(tool_exchanges(trajectory)))
    if measure == "turns":
        return float(assistant_turns(trajectory))
    return float(sum(len(m.content) for m in trajectory.messages if m.role == "assistant"))


@dataclass(frozen=True)
class EffortPenalty:
    """Composer's effort penalty, negated: -((1 + k·x)^(1-q) - 1) / (k·(1-q)) with x = effort / scale.

    With q > 1 it is bounded by 1/(k·(q-1)): the defaults (k=1, q=2) cost x/(1+x), under 1 however long
    the episode, so effort never outweighs solving the task.
    """

    k: float = 1.0
    """Where the curve bends (> 0)."""
    q: float = 2.0
    """Concavity (>= 0): 0 is linear, 1 logarithmic, above 1 bounded."""
    measure: EffortMeasure = "tool_calls"
    """What counts as effort: tool calls, assistant turns or assistant characters."""
    scale: float = 1.0
    """Effort units per x (e.g. 1000 for characters)."""
    value_range: ClassVar[tuple[float, float]] = NEG_INF_TO_ZERO

    def __post_init__(self) -> None:
        effort_penalty(0.0, self.k, self.q)  # validates k and q, naming them
        if self.measure not in ("tool_calls", "turns", "assistant_chars"):
            raise ValueError(f"EffortPenalty.measure must be tool_calls, turns or assistant_chars: {self.measure!r}")
        if not self.scale > 0:
            raise ValueError(f"EffortPenalty.scale must be > 0, got {self.scale}")

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        return -effort_penalty(effort(trajectory, self.measure) / self.scale, self.k, self.q)


SUMMARIES_KEY = "summaries"
"""``trajectory.info["summaries"]``: ``[{"message_index": int, "text": str}, ...]``, one per self-summary, in
order. ``message_index`` is the index in ``trajectory.messages`` where the continuation after that summary
starts (messages before it were what the summary condensed)."""


@dataclass(frozen=True)
class SummaryUsefulness:
    """Was a self-summary useful: did the continuation succeed, without re-reading what the summary held?

    value = success · (1 - re-read share), averaged over summaries. A re-read is a call after a summary that
    repeats a call made before it (same tool, same arguments) while the summary text already names one of the
    call's string arguments (e.g. the file path). None when the episode has no summaries.
    """

    success: TermFn
    """The continuation's outcome in [0, 1] (e.g. ``TestPassRate()``); None from it makes this term None."""
    key: str = SUMMARIES_KEY
    """``trajectory.info`` key of the summary records."""
    value_range: ClassVar[tuple[float, float]] = UNIT

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        summaries = trajectory.info.get(self.key) or []
        if not summaries:
            return None
        outcome = self.success(trajectory, task)
        if outcome is None:
            return None
        if not 0.0 <= outcome <= 1.0:
            raise ValueError(f"SummaryUsefulness.success returned {outcome}; it must score in [0, 1]")
        exchanges = [e for e in tool_exchanges(trajectory) if not e.is_invalid]
        bounds = sorted(_summary_record(s, len(trajectory.messages), self.key) for s in summaries)
        shares = []
        for i, (start, text) in enumerate(bounds):
            end = bounds[i + 1][0] if i + 1 < len(bounds) else len(trajectory.messages)
            before = {e.key for e in exchanges if e.message_index < start}
            after = [e for e in exchanges if start <= e.message_index < end]
            rereads = sum(e.key in before and _named_in(e.call.arguments, text) for e in after)
            shares.append(rereads / len(after) if after else 0.0)
        return outcome * (1.0 - sum(shares) / len(shares))


def _summary_record(record: Any, num_messages: int, key: str) -> tuple[int, str]:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise ValueError(f"trajectory.info[{key!r}] entries must be {{'message_index': int, 'text': str}}")
    index = record.get("message_index")
    if not isinstance(index, int) or not 0 <= index <= num_messages:
        raise ValueError(f"trajectory.info[{key!r}]: message_index {index!r} is not in [0, {num_messages}]")
    return index, record["text"]


def _named_in(arguments: dict[str, Any], text: str) -> bool:
    return any(isinstance(v, str) and v.strip() and v in text for v in arguments.values())


def _normalised_answer(trajectory: Trajectory) -> str | None:
    answer = trajectory.final_answer
    return " ".join(answer.lower().split()).rstrip(".") if answer and answer.strip() else None


@dataclass(frozen=True)
class OutputAgreement:
    """Output stability as self-consistency: the share of the OTHER samples of the group whose final answer
    (case- and space-normalised) equals this one's. A GROUP term; 0 without a final answer; None for a group
    of one. The seed names "output stability" without a formula; this is our reading of it."""

    value_range: ClassVar[tuple[float, float]] = UNIT

    def __call__(self, trajectories: Sequence[Trajectory], task: Task | None) -> list[float | None]:
        k = len(trajectories)
        if k < 2:
            return [None] * k
        answers = [_normalised_answer(t) for t in trajectories]
        counts = Counter(a for a in answers if a is not None)
        return [(counts[a] - 1) / (k - 1) if a is not None else 0.0 for a in answers]


@dataclass(frozen=True)
class InfoFlag:
    """1.0 when ``trajectory.info[key]`` is falsy (the bad thing did not happen), 0.0 when truthy, None when
    absent; for gates over facts an env records, e.g. ``InfoFlag("tests_tampered")``."""

    key: str
    """``trajectory.info`` key of a flag that marks a failure."""
    value_range: ClassVar[tuple[float, float]] = UNIT

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        if trajectory.info.get(self.key) is None:
            return None
        return 0.0 if trajectory.info[self.key] else 1.0
