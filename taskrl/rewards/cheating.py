"""Anti-cheating terms: grounding (no fabricated answers), busy-work, trivial tests, fake parallelism, and
PARL's finish credit over sub-agents.

Contracts other components write (documented in docs/design/monitors-and-eval.md): ``trajectory.info["test_coverage"]``
(code env), sub-agent ``child.info["started_at"]``/``["ended_at"]`` and ``info["subagents_created"]`` (swarm env).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from taskrl.rewards.formulas import max_overlap, r_finish, r_parallel
from taskrl.rewards.views import evidence_text, extract_facts, states, tool_exchanges
from taskrl.types import Task, Trajectory


@dataclass(frozen=True)
class Grounding:
    """Share of the final answer's facts found in evidence the agent actually received in this episode.

    Facts come from ``extractor`` (default: the numbers in the text and the cells of a Markdown table). Evidence
    is every successful tool result. With ``include_prompt``, facts the task itself states (its quantities, row
    numbers, its own words) are given, not found: they are left out of the share, and an answer whose every
    fact is given found nothing, so it scores 0 (a table of row numbers, or of phrases copied from the prompt,
    is fabricated). A fabricated answer (facts no tool ever returned) scores 0; use it as a gate's check
    (``GateRule``) so such an episode scores as a failure. None when there is no final answer or it states no
    extractable fact.
    """

    extractor: Callable[[str], set[str]] = extract_facts
    """Text -> the set of normalised facts it states."""
    include_prompt: bool = True
    """Treat facts the task itself gave (system/user messages) as given: out of the share, never enough alone."""
    match: Literal["extracted", "substring"] = "extracted"
    """``extracted``: a fact must be among the facts extracted from the evidence (a phrase may also appear
    there as whole words); ``substring``: it must appear in the evidence text (case-insensitive), for
    extractors whose facts are phrases."""
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __post_init__(self) -> None:
        if self.match not in ("extracted", "substring"):
            raise ValueError(f"Grounding.match must be 'extracted' or 'substring', got {self.match!r}")

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        answer = trajectory.final_answer
        facts = self.extractor(answer) if answer else set()
        if not facts:
            return None
        if self.include_prompt:
            prompt = "\n".join(m.content for m in trajectory.messages if m.role in ("system", "user"))
            given = self._stated_by(prompt)
            facts = {f for f in facts if not given(f)}
            if not facts:  # every fact restates the task: nothing the agent found
                return 0.0
        found = self._stated_by(evidence_text(trajectory, include_prompt=False))
        return sum(found(f) for f in facts) / len(facts)

    def _stated_by(self, text: str) -> Callable[[str], bool]:
        """Whether ``text`` states a fact (its facts extracted once)."""
        if self.match == "substring":
            lowered = text.lower()
            return lambda fact: str(fact).lower() in lowered
        text_facts = set(self.extractor(text))
        return lambda fact: states(text, fact, text_facts)


@dataclass(frozen=True)
class BusyWork:
    """Busy-work detector: minus the share of executed calls that were repeated calls of a cheap tool
    whose result brought no new information (the same text that tool already returned in this episode).
    None without executed calls. Range [-1, 0]."""

    costs: Mapping[str, float] = field(default_factory=dict)
    """Cost per call of each tool (e.g. ``{t.name: t.cost for t in env.tools}``); missing tools cost 0."""
    max_cost: float = 0.0
    """Tools costing at most this are cheap; repeats of expensive tools are the tool-cost term's business."""
    value_range: ClassVar[tuple[float, float]] = (-1.0, 0.0)

    def __post_init__(self) -> None:
        if not (self.max_cost >= 0 and math.isfinite(self.max_cost)):
            raise ValueError(f"BusyWork.max_cost must be a finite number >= 0, got {self.max_cost}")

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        ran = [e for e in tool_exchanges(trajectory) if not e.is_invalid and e.result is not None]
        if not ran:
            return None
        seen: dict[str, set[str]] = {}
        busy = 0
        for e in ran:
            results = seen.setdefault(e.call.name, set())
            content = e.result.content  # type: ignore[union-attr]
            if content in results and self.costs.get(e.call.name, 0.0) <= self.max_cost:
                busy += 1
            results.add(content)
        return -busy / len(ran)


TEST_COVERAGE_KEY = "test_coverage"
"""``trajectory.info["test_coverage"]``: line coverage in [0, 1] of the code under test achieved by the tests
the agent wrote (coverage.py, measured by the code env inside its sandbox). Absent = the agent wrote no tests."""


@dataclass(frozen=True)
class TrivialTests:
    """Trivial-test penalty for generated tests, growing exponentially with how little they cover:
    -(exp(a·s) - 1) / (exp(a) - 1), s = max(0, target - coverage) / target. 0 at or above the target, -1 at
    zero coverage. None when ``trajectory.info`` has no coverage (no tests were written)."""

    target: float = 0.8
    """Coverage that earns no penalty."""
    sharpness: float = 3.0
    """a: how fast the penalty grows as coverage falls (the seed asks for exponential growth)."""
    key: str = TEST_COVERAGE_KEY
    """``trajectory.info`` key of the coverage fraction."""
    value_range: ClassVar[tuple[float, float]] = (-1.0, 0.0)

    def __post_init__(self) -> None:
        if not 0.0 < self.target <= 1.0:
            raise ValueError(f"TrivialTests.target must be in (0, 1], got {self.target}")
        if not (self.sharpness > 0 and math.isfinite(self.sharpness)):
            raise ValueError(f"TrivialTests.sharpness must be a positive finite number, got {self.sharpness}")

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        if trajectory.info.get(self.key) is None:
            return None
        coverage = float(trajectory.info[self.key])
        if not 0.0 <= coverage <= 1.0:
            raise ValueError(f"trajectory.info[{self.key!r}] must be a coverage fraction in [0, 1], got {coverage}")
        shortfall = max(0.0, self.target - coverage) / self.target
        return -math.expm1(self.sharpness * shortfall) / math.expm1(self.sharpness)


def subagent_intervals(trajectory: Trajectory) -> list[tuple[float, float]]:
    """(started_at, ended_at) of each sub-agent (``trajectory.children``) that recorded both times."""
    out = []
    for child in trajectory.children:
        start, end = child.info.get("started_at"), child.info.get("ended_at")
        if isinstance(start, int | float) and isinstance(end, int | float):
            if end < start:
                raise ValueError(f"sub-agent {child.id}: ended_at {end} is before started_at {start}")
            out.append((float(start), float(end)))
    return out


@dataclass(frozen=True)
class ParallelCredit:
    """PARL's r_parallel measured from what actually ran: min(1, max overlapping sub-agents / K).

    Sub-agents created but run one after another (fake parallelism) never overlap and earn 0: a sub-agent
    running alone is not parallelism, so a maximum overlap below 2 counts as 0. 0 without sub-agents.
    """

    k: int = 4
    """Overlapping sub-agents for full credit."""
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __post_init__(self) -> None:
        r_parallel(0, self.k)  # validates k

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        overlap = max_overlap(subagent_intervals(trajectory))
        return r_parallel(overlap if overlap >= 2 else 0, self.k)


@dataclass(frozen=True)
class FinishCredit:
    """PARL's r_finish: sub-agents that finished with a non-empty result / sub-agents created (0 if none).

    Created = ``trajectory.info["subagents_created"]`` when the env records it (a sub-agent that was never
    assigned a task has no child trajectory), else the number of children.
    """

    created_key: str = "subagents_created"
    """``trajectory.info`` key of the number of sub-agents created."""
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        finished = sum(c.error is None and bool((c.final_answer or "").strip()) for c in trajectory.children)
        created: Any = trajectory.info.get(self.created_key, len(trajectory.children))
        return r_finish(finished, max(int(created), len(trajectory.children)))
