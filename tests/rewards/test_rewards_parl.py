"""Golden values and properties of the PARL credit (``taskrl.rewards.parl``): the step clock, useful sub-tasks,
r_parallel / r_finish / r_efficiency, and that decoys, repeats and padding never raise an honest episode's reward."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rubric_weigh import weigh

from taskrl.envs.swarm.critical import critical_steps
from taskrl.rewards.formulas import max_overlap, r_efficiency
from taskrl.rewards.parl import (
    CriticalEfficiency,
    UsefulFinish,
    UsefulParallelism,
    is_trivial,
    schedule_length,
    step_schedule,
    subtasks,
)
from taskrl.rewards.presets import parl
from taskrl.rewards.terms import AnswerMatch
from taskrl.scoring import Clock
from taskrl.types import Task, Trajectory


def test_step_schedule_golden() -> None:
    # turn 0: agents a (3 steps, then 2 more queued) and b (4); turn 1: nobody; turn 2: c (1)
    turns = [[("a", 3), ("b", 4), ("a", 2)], [], [("c", 1)]]
    assert step_schedule(turns) == [[(1, 4), (1, 5), (4, 6)], [], [(8, 9)]]
    assert schedule_length(turns) == 9  # (1 + 5) + 1 + (1 + 1)
    assert max_overlap([(1, 4), (1, 5), (4, 6)]) == 2 and max_overlap([(0, 0), (0, 0)]) == 0
    with pytest.raises(ValueError, match="turn 0"):
        step_schedule([[("a", -1)]])


@given(st.lists(st.lists(st.integers(0, 30), max_size=6), max_size=8))
def test_one_task_per_agent_is_designs_critical_steps(turns: list[list[int]]) -> None:
    as_agents = [[(i, s) for i, s in enumerate(turn)] for turn in turns]
    assert schedule_length(as_agents) == critical_steps(turns)
    queued = [[(0, s) for s in turn] for turn in turns]  # one agent for everything: as slow as serial play
    assert schedule_length(queued) == sum(1 + sum(turn) for turn in turns)


def test_trivial_answers() -> None:
    assert all(map(is_trivial, ["ANSWER: unknown", "  n/a ", "", None, "Answer: I don't know.", "`none`"]))
    assert not any(map(is_trivial, ["ANSWER: 42", "unknown soldier"]))


def swarm(answers: list[str | None], turns: list[int], *, final: str = "x", critical: float | None = None,
          **info: object) -> Trajectory:  # fmt: skip
    kids = []
    for answer, turn in zip(answers, turns, strict=True):
        kid = Trajectory(info={"turn": turn} | ({"final_answer": answer} if answer is not None else {}))
        kid.metrics["turns"] = 2.0
        kids.append(kid)
    traj = Trajectory(children=kids, terminated=True, info={"final_answer": final, **info})
    if critical is not None:
        traj.metrics["critical_steps"] = critical
    return traj


TASK = Task("q", "q", answer="x")


def test_fallback_usefulness_repeats_and_trivial_answers_earn_nothing() -> None:
    traj = swarm(["a", "A.", "unknown", None, "b"], [0, 0, 0, 0, 0])
    assert [t.useful for t in subtasks(traj)] == [True, False, False, False, True]
    assert UsefulParallelism(4)(traj, TASK) == 0.5 and UsefulFinish()(traj, TASK) == pytest.approx(2 / 5)
    assert UsefulParallelism(4)(swarm(["a", "b", "c"], [0, 1, 2]), TASK) == 0.0  # one at a time
    # the env's verdict wins over the fallback
    judged = swarm(["a", "b"], [0, 0])
    judged.children[1].info.update(useful=False, decoy=True)
    assert UsefulParallelism(2)(judged, TASK) == 0.0 and UsefulFinish()(judged, TASK) == 0.5
    # the task's size caps the parallelism that earns full credit
    assert UsefulParallelism(4)(swarm(["a", "b", "c"], [0, 0, 0], task_size=3), TASK) == 1.0


def test_efficiency_golden_and_truncation_keeps_no_auxiliary_credit() -> None:
    assert r_efficiency(1.0, 4, 100, 1.0) == pytest.approx(0.96)
    assert r_efficiency(0.5, 150, 100, 1.0) == 0.0 and r_efficiency(1.0, 10, 100, 0.5) == pytest.approx(0.45)
    with pytest.raises(ValueError, match="budget"):
        r_efficiency(1.0, 1, 0, 1.0)
    term = CriticalEfficiency(AnswerMatch(), budget=100)
    assert term(swarm(["a", "b", "a"], [0, 0, 0], critical=4), TASK) == pytest.approx(0.96 * 2 / 3)
    assert term(swarm(["a"], [0]), TASK) is None  # no critical steps recorded
    cut = swarm(["a", "b"], [0, 0], critical=4)
    cut.truncated = True
    assert {k: v for k, v in weigh(parl(), cut, TASK).items() if k != "perf"} == {
        "parallel": 0.0, "finish": 0.0, "efficiency": 0.0}  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 10), extra=st.lists(st.sampled_from(["dummy", "repeat", "unknown"]), min_size=1, max_size=12),
    serial=st.booleans(), step=st.integers(0, 1000), anneal=st.sampled_from(["linear", "cosine"]),
)  # fmt: skip
def test_decoys_never_raise_an_honest_episodes_reward(
    rows: int, extra: list[str], serial: bool, step: int, anneal: str
) -> None:
    """Adding dummies, repeats or "unknown" replies to an honest episode (fan-out or serial) lowers its reward.
    Repeats and "unknown" are caught by the fallback; a dummy's distinct reply needs the env's verdict (the swarm
    env judges it off-task), which is what ``info["useful"]`` carries."""
    answers = [f"r{i}" for i in range(rows)]
    turns = list(range(rows)) if serial else [0] * rows
    honest = swarm(answers, turns, critical=float(len(set(turns)) * 3 + 1), task_size=rows)
    added = {"dummy": "hello", "repeat": "r0", "unknown": "ANSWER: unknown"}
    cheat = swarm(answers + [added[e] for e in extra], turns + [0] * len(extra),
                  critical=honest.metrics["critical_steps"], task_size=rows)  # fmt: skip
    for kid in cheat.children:
        if kid.final_answer == "hello":
            kid.info.update(useful=False, decoy=True)
    reward = parl(anneal=anneal)  # type: ignore[arg-type]
    total = lambda t: sum(v for v in weigh(reward, t, TASK, Clock(step)).values() if v is not None)  # noqa: E731
    assert total(cheat) < total(honest)


def test_the_overlap_count_is_written_once() -> None:
    """Issue 39 item 5: PARL's step-clock overlap, the wall-clock parallel credit and the swarm env's metric all
    count with ``formulas.max_overlap``; no module keeps its own sweep."""
    import importlib

    # by module path: the packages export functions named like these modules (``taskrl.rewards.parl``, ``env``)
    parl, cheating, formulas, swarm_env = (importlib.import_module(f"taskrl.{name}") for name in
                                           ("rewards.parl", "rewards.cheating", "rewards.formulas", "envs.swarm.env"))
    assert parl.max_overlap is cheating.max_overlap is swarm_env.max_overlap is formulas.max_overlap
    assert not hasattr(cheating, "max_concurrency") and not hasattr(swarm_env, "_max_overlap")
