"""Golden values of the outcome and auxiliary terms (answer match, tests, valid tool use, exploration, costs,
effort, summary usefulness, agreement)."""

from __future__ import annotations

import math

import pytest

from taskrl.env import make
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
    tool_combination,
)
from taskrl.types import Task

BAD = "Unknown tool 'nope'. Available tools: a, b."


def test_answer_match_modes(build) -> None:
    task = Task("t", "q", answer=48)
    assert AnswerMatch("number")(build().answer("The total is 48."), task) == 1.0
    assert AnswerMatch("number")(build().answer("48 or 49"), task) == 0.0  # the last number counts
    assert AnswerMatch("exact")(build().answer("  48 "), task) == 1.0
    assert AnswerMatch("contains")(build().answer("it is 48 dollars"), task) == 1.0
    assert AnswerMatch()(build().answer(None), task) is None
    assert AnswerMatch()(build().answer("x"), Task("t", "q")) is None
    with pytest.raises(ValueError, match="mode"):
        AnswerMatch("fuzzy")  # type: ignore[arg-type]


def test_test_pass_rate_no_tests_collected_is_failure(build) -> None:
    assert TestPassRate()(build().answer("x", tests_passed=3, tests_total=4), None) == 0.75
    assert TestPassRate()(build().answer("x", tests_passed=0, tests_total=0), None) == 0.0
    assert TestPassRate()(build().answer("x"), None) is None
    with pytest.raises(ValueError, match="tests_passed=5"):
        TestPassRate()(build().answer("x", tests_passed=5, tests_total=4), None)


def test_valid_tool_use(build) -> None:
    traj = build().turn(("a", {}, "ok"), ("nope", {}, BAD)).turn(("b", {}, "Tool 'b' failed: KeyError")).answer("x")
    assert math.isclose(ValidToolUse()(traj, None), 2 / 3)  # a tool failing at run time is still a valid call
    assert ValidToolUse()(build().answer("x"), None) is None
    assert math.isclose(ValidToolUse(count_errors=True)(traj, None), 1 / 3)  # ...unless run-time errors count
    assert ValidToolUse(count_errors=True)(build().answer("x"), None) is None


def test_exploration_bonus_golden(build) -> None:
    group = [
        build().turn(("search", {"q": 1}, "r"), ("read", {}, "r")).answer("x"),
        build().turn(("read", {}, "r")).turn(("search", {"q": 2}, "r")).answer("x"),  # same set, other order
        build().turn(("grep", {}, "r")).answer("x"),
        build().answer("x"),
    ]
    assert ExplorationBonus()(group, None) == [2 / 3, 2 / 3, 1.0, 0.0]
    assert ExplorationBonus("sequence")(group, None) == [1.0, 1.0, 1.0, 0.0]
    assert ExplorationBonus()(group[:1], None) == [None]
    assert tool_combination(group[1], "sequence") == ("read", "search")


def test_tool_cost_penalty_counts_calls_that_ran(build) -> None:
    shop = make("shop")
    traj = build().turn(("lookup_price", {}, "r"), ("nope", {}, BAD)).turn(("calculator", {}, "r")).answer("x")
    assert ToolCostPenalty({"lookup_price": 0.1, "calculator": 0.05})(traj, None) == pytest.approx(-0.15)
    assert ToolCostPenalty.from_toolset(shop.tools)(traj, None) == 0.0  # the shop's tools are free
    assert ToolCostPenalty(default_cost=1.0)(traj, None) == -2.0
    with pytest.raises(ValueError, match="costs"):
        ToolCostPenalty({"a": -1.0})


def test_effort_penalty_term_golden(build) -> None:
    traj = build().turn(("a", {}, "r"), ("a", {}, "r"), ("a", {}, "r")).answer("hello")
    assert EffortPenalty()(traj, None) == pytest.approx(-0.75)  # k=1, q=2: x/(1+x) at x=3
    assert EffortPenalty(k=0.5, q=0.0)(traj, None) == pytest.approx(-3.0)  # q=0: linear
    assert EffortPenalty(measure="turns", q=1.0)(traj, None) == pytest.approx(-math.log(3))
    assert EffortPenalty(measure="assistant_chars", scale=5.0)(traj, None) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="scale"):
        EffortPenalty(scale=0)


def test_summary_usefulness_golden(build) -> None:
    success = TestPassRate()
    b = build().turn(("read_file", {"path": "a.py"}, "A")).turn(("read_file", {"path": "b.py"}, "B"))
    cut = len(b.messages)
    b.turn(("read_file", {"path": "a.py"}, "A")).turn(("run_tests", {}, "ok")).turn(
        ("read_file", {"path": "b.py"}, "B")
    )
    summaries = [{"message_index": cut, "text": "a.py defines f; the bug is in f"}]
    traj = b.answer("done", tests_passed=1, tests_total=1, summaries=summaries)
    # After the summary: 3 calls, one re-reads a.py which the summary already held (b.py it did not name).
    assert SummaryUsefulness(success)(traj, None) == pytest.approx(2 / 3)
    failed = b.answer("done", tests_passed=0, tests_total=1, summaries=summaries)
    assert SummaryUsefulness(success)(failed, None) == 0.0
    assert SummaryUsefulness(success)(b.answer("done", tests_passed=1, tests_total=1), None) is None
    with pytest.raises(ValueError, match="message_index"):
        SummaryUsefulness(success)(
            b.answer("x", tests_passed=1, tests_total=1, summaries=[{"message_index": 99, "text": ""}]), None
        )


def test_output_agreement_and_info_flag(build) -> None:
    group = [build().answer("Paris"), build().answer(" paris. "), build().answer("Lyon"), build().answer(None)]
    assert OutputAgreement()(group, None) == [1 / 3, 1 / 3, 0.0, 0.0]
    assert InfoFlag("tests_tampered")(build().answer("x", tests_tampered=True), None) == 0.0
    assert InfoFlag("tests_tampered")(build().answer("x", tests_tampered=False), None) == 1.0
    assert InfoFlag("tests_tampered")(build().answer("x"), None) is None
