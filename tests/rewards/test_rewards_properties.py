"""Property tests: every term and preset stays in its documented range and never raises, on arbitrary,
empty and truncated trajectories (calls without results, missing answers, partial info)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.rewards.cheating import BusyWork, FinishCredit, Grounding, ParallelCredit, TrivialTests
from taskrl.rewards.loops import LoopPenalty
from taskrl.rewards.presets import (
    PRESETS,
    AnswerFound,
    OutputPrecision,
    OutputRecall,
    PrunePenalty,
    TrajectoryRecall,
    TurnPenalty,
)
from taskrl.rewards.terms import (
    AnswerMatch,
    EffortPenalty,
    ExplorationBonus,
    InfoFlag,
    OutputAgreement,
    SummaryUsefulness,
    TestPassRate,
    ToolCostPenalty,
    ValidToolUse,
)
from taskrl.scoring import Clock, rescore
from taskrl.types import Message, Task, ToolCall, Trajectory

TERMS = [
    AnswerMatch("exact"), AnswerMatch("number"), AnswerMatch("contains"), TestPassRate(), ValidToolUse(),
    ToolCostPenalty({"search": 0.5}, default_cost=0.1), EffortPenalty(), EffortPenalty(k=2, q=0.5, measure="turns"),
    EffortPenalty(q=1.0, measure="assistant_chars", scale=100), SummaryUsefulness(TestPassRate()), Grounding(),
    Grounding(lambda text: set(text.split()), match="substring"), BusyWork(), TrivialTests(), ParallelCredit(3),
    FinishCredit(), InfoFlag("tests_tampered"), LoopPenalty(), OutputPrecision(), OutputRecall(), TrajectoryRecall(),
    AnswerFound(),
    PrunePenalty(), TurnPenalty(start=2, end=5),
]  # fmt: skip
GROUP_TERMS = [ExplorationBonus(), ExplorationBonus("sequence"), OutputAgreement()]

CHUNKS = st.lists(st.sampled_from(["c1", "c2", "c3", "c4", "c5"]), max_size=5)
RESULTS = st.one_of(
    st.sampled_from(
        [
            "ok",
            "apple: $3",
            "6",
            "48.5",
            "",
            "Unknown tool 'x'. Available tools: a.",
            "Tool 'calc' failed: ValueError",
            "Invalid tool call: not valid JSON (x).",
        ]
    ),  # fmt: skip
    st.text(max_size=12),
)
CALL = st.tuples(
    st.sampled_from(["search", "read", "prune_chunks", "list", "calc"]),
    st.dictionaries(st.sampled_from(["q", "path", "id"]), st.one_of(st.integers(0, 3), st.sampled_from(["a.py", "b"]))),
    RESULTS,
)


@st.composite
def trajectories(draw: Any) -> Trajectory:
    messages = [Message("system", "s"), Message("user", draw(st.sampled_from(["2 x apple", "who?", ""])))]
    n = 0
    for calls in draw(st.lists(st.lists(CALL, max_size=3), max_size=7)):
        tool_calls = [ToolCall(f"call_{n + i}", name, args) for i, (name, args, _) in enumerate(calls)]
        n += len(calls)
        messages.append(Message("assistant", "", tool_calls=tool_calls))
        results = [result for _, _, result in calls]
        messages += [
            Message("tool", r, tool_call_id=c.id, name=c.name) for c, r in zip(tool_calls, results, strict=True)
        ]
    answer = draw(st.one_of(st.none(), st.sampled_from(["6", "The total is 48.5.", "pretzels"]), st.text(max_size=10)))
    if answer is not None:
        messages.append(Message("assistant", answer))
    messages = messages[: draw(st.integers(0, len(messages)))]  # truncated anywhere, even mid-turn
    info: dict[str, Any] = {} if answer is None else {"final_answer": answer}
    if draw(st.booleans()):
        total = draw(st.integers(0, 5))
        info.update(tests_total=total, tests_passed=draw(st.integers(0, total)))
    if draw(st.booleans()):
        info["test_coverage"] = draw(st.floats(0.0, 1.0))
    if draw(st.booleans()):
        indices = draw(st.lists(st.integers(0, len(messages)), max_size=2))
        info["summaries"] = [{"message_index": i, "text": draw(st.sampled_from(["a.py", "", "b"]))} for i in indices]
    if draw(st.booleans()):
        info.update(output_chunks=draw(CHUNKS), seen_chunks=draw(CHUNKS))
    if draw(st.booleans()):
        info["tests_tampered"] = draw(st.booleans())
    children = []
    for start, duration, child_answer in draw(
        st.lists(st.tuples(st.floats(0, 10), st.floats(0, 5), st.sampled_from(["", "x", None])), max_size=4)
    ):
        child_info = {"started_at": start, "ended_at": start + duration, "final_answer": child_answer}
        children.append(Trajectory(info=child_info, trainable=False))
    if children and draw(st.booleans()):
        info["subagents_created"] = draw(st.integers(0, 6))
    terminated = draw(st.booleans())
    return Trajectory(task_id="t", messages=messages, info=info, children=children, terminated=terminated)


@st.composite
def tasks(draw: Any) -> Task | None:
    if draw(st.booleans()):
        return None
    info: dict[str, Any] = {}
    if draw(st.booleans()):
        info["relevant_chunks"] = draw(CHUNKS)
    if draw(st.booleans()):
        info["facts"] = [{"chunk_ids": chunks} for chunks in draw(st.lists(CHUNKS, max_size=3))]
    if draw(st.booleans()):
        info["answer_chunk_ids"] = draw(CHUNKS)
    return Task("t", "q", answer=draw(st.sampled_from([None, "6", 48.5, "pretzels"])), info=info)


def assert_in_range(term: Any, value: Any) -> None:
    if value is None:
        return
    low, high = term.value_range
    assert isinstance(value, float) and math.isfinite(value), (term, value)
    assert low - 1e-9 <= value <= high + 1e-9, (term, value)


@settings(max_examples=150, deadline=None)
@given(trajectories(), tasks())
def test_every_term_stays_in_range_and_never_raises(trajectory: Trajectory, task: Task | None) -> None:
    for term in TERMS:
        assert_in_range(term, term(trajectory, task))


@settings(max_examples=60, deadline=None)
@given(st.lists(trajectories(), max_size=4), tasks())
def test_group_terms_and_presets_never_raise_on_any_group(group: list[Trajectory], task: Task | None) -> None:
    for term in GROUP_TERMS:
        values = term(group, task)
        assert len(values) == len(group)
        for value in values:
            assert_in_range(term, value)
    for name, build in PRESETS.items():
        rubric = build()
        for traj in group:
            traj.group_id = "g"
        rescore(group, rubric, Clock(), task_of=lambda _: task)
        assert all(math.isfinite(t.reward) for t in group), name


def test_empty_trajectory_scores_without_error() -> None:
    for term in TERMS:
        assert_in_range(term, term(Trajectory(), None))
    for build in PRESETS.values():
        traj = Trajectory()
        rescore([traj], build(), Clock())
        assert math.isfinite(traj.reward)
