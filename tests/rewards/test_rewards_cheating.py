"""Golden values of the anti-cheating terms: grounding, busy-work, trivial tests, fake parallelism, finish."""

from __future__ import annotations

import math

import pytest

from taskrl.envs.swarm.tasks import WIDE, render_prompt
from taskrl.rewards.cheating import (
    BusyWork,
    FinishCredit,
    Grounding,
    ParallelCredit,
    TrivialTests,
    subagent_intervals,
)
from taskrl.rewards.formulas import max_overlap
from taskrl.rewards.views import extract_facts, extract_numbers
from taskrl.types import Trajectory


def test_grounding_golden(build) -> None:
    honest = build("2 x apple").turn(("lookup_price", {"item": "apple"}, "apple: $3")).turn(("calc", {}, "6"))
    assert Grounding()(honest.answer("2 apples cost 6"), None) == 1.0  # 2 from the prompt, 6 from a tool
    assert Grounding()(build("2 x apple").answer("The total is 6."), None) == 0.0  # fabricated
    assert Grounding(include_prompt=False)(honest.answer("2 apples cost 6"), None) == 0.5
    assert Grounding()(honest.answer("It costs 6 or 7"), None) == 0.5
    assert Grounding()(honest.answer("no numbers here"), None) is None
    assert Grounding()(honest.answer(None), None) is None
    failed = build().turn(("calc", {}, "Tool 'calc' failed: ValueError 6"))  # error text is not evidence
    assert Grounding()(failed.answer("6"), None) == 0.0


def test_grounding_with_a_phrase_extractor_and_substring_match(build) -> None:
    def capitalised(text: str) -> set[str]:
        return {w.strip(".,") for w in text.split() if w[:1].isupper()}

    traj = build("who?").turn(("search", {}, "the winner was marie curie")).answer("Marie Curie won. Einstein too.")
    assert Grounding(capitalised, match="substring")(traj, None) == pytest.approx(2 / 3)
    assert extract_numbers("1,200.50 and 18.0 and v1.2.3") == {"1200.5", "18"}


def test_busy_work_golden(build) -> None:
    traj = (
        build()
        .turn(("list", {}, "a, b"), ("list", {}, "a, b"))  # second list: nothing new
        .turn(("filter", {"x": 1}, "a"), ("list", {"page": 2}, "a, b"))  # other args, same result: busy
        .turn(("fetch", {}, "big"), ("fetch", {}, "big"))  # expensive tool: the cost term's business
        .turn(("nope", {}, "Unknown tool 'nope'. Available tools: list."))
        .answer("x")
    )
    assert BusyWork({"fetch": 1.0})(traj, None) == pytest.approx(-2 / 6)
    assert BusyWork()(traj, None) == pytest.approx(-3 / 6)
    assert BusyWork()(build().answer("x"), None) is None


def test_trivial_tests_golden(build) -> None:
    term = TrivialTests(target=0.8, sharpness=3.0)
    assert term(build().answer("x", test_coverage=0.9), None) == 0.0
    assert term(build().answer("x", test_coverage=0.0), None) == pytest.approx(-1.0)
    assert term(build().answer("x", test_coverage=0.4), None) == pytest.approx(-math.expm1(1.5) / math.expm1(3.0))
    assert term(build().answer("x"), None) is None
    with pytest.raises(ValueError, match="test_coverage"):
        term(build().answer("x", test_coverage=1.5), None)


def swarm(intervals: list[tuple[float, float] | None], answers: list[str] | None = None) -> Trajectory:
    children = []
    for i, span in enumerate(intervals):
        info = {} if span is None else {"started_at": span[0], "ended_at": span[1]}
        answer = (answers or ["done"] * len(intervals))[i]
        children.append(Trajectory(task_id=f"sub{i}", info={**info, "final_answer": answer}, trainable=False))
    return Trajectory(task_id="t", children=children)


def test_parallel_credit_serial_runs_earn_nothing() -> None:
    assert max_overlap([(0, 2), (1, 3), (1.5, 2.5)]) == 3  # the one overlap count (formulas.max_overlap)
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1  # touching intervals do not overlap
    assert ParallelCredit(4)(swarm([(0, 2), (1, 3), (1.5, 2.5)]), None) == 0.75
    assert ParallelCredit(2)(swarm([(0, 2), (1, 3), (1.5, 2.5)]), None) == 1.0
    assert ParallelCredit(4)(swarm([(0, 1), (1, 2), (2, 3), (3, 4)]), None) == 0.0  # fake parallelism
    assert ParallelCredit(4)(swarm([]), None) == 0.0
    assert subagent_intervals(swarm([(0, 1), None])) == [(0.0, 1.0)]
    with pytest.raises(ValueError, match="before started_at"):
        subagent_intervals(swarm([(2, 1)]))


def test_finish_credit_golden() -> None:
    assert FinishCredit()(swarm([(0, 1)] * 4, ["a", "", "  ", "b"]), None) == 0.5
    spawned = swarm([(0, 1)], ["a"])
    spawned.info["subagents_created"] = 4  # three were created and never given a task
    assert FinishCredit()(spawned, None) == 0.25
    assert FinishCredit()(swarm([]), None) == 0.0


def test_grounding_fails_a_table_that_only_restates_the_prompt(build) -> None:
    prompt = render_prompt(WIDE, ["Which colour is the flag of the amber club?", "Who founded the birch club?"])
    honest = (
        build(prompt)
        .turn(("assign_task", {"agent_id": "a", "task": "amber flag"}, "ANSWER: amber-blue"))
        .turn(("assign_task", {"agent_id": "b", "task": "birch founder"}, "ANSWER: Ada Birch"))
    )
    assert Grounding()(honest.answer("| 1 | amber-blue |\n| 2 | Ada Birch |"), None) == 1.0
    # issue 37: the only numbers of a fabricated table are its row numbers, which the prompt states
    assert Grounding()(honest.answer("| 1 | scarlet |\n| 2 | John Smith |"), None) == 0.0
    assert Grounding()(honest.answer("| 1 | |\n| 2 | |"), None) == 0.0  # rows only: nothing found
    copied = honest.answer("| 1 | the flag of the amber club |\n| 2 | the birch club |")
    assert Grounding()(copied, None) == 0.0  # the prompt's own words are given, not found
    assert Grounding()(honest.answer("| 1 | amber-blue |\n| 2 | John Smith |"), None) == 0.5
    assert extract_facts("| row | answer |\n|---|---|\n| 1 | Ada  Birch. |") == {"1", "row", "answer", "ada birch"}
