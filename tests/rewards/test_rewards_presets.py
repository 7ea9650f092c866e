"""Golden values of the four presets (context1, parl, seed_weighted, composer) and their annealing."""

from __future__ import annotations

import math

import pytest
from rubric_weigh import weigh

from taskrl.rewards.formulas import f_beta
from taskrl.rewards.presets import PRESETS, composer, context1, make_reward, parl, seed_weighted
from taskrl.scoring import Clock, score
from taskrl.types import Task, Trajectory


def total(rewards: dict[str, float | None]) -> float:
    return sum(v for v in rewards.values() if v is not None)


def search_task(**info: object) -> Task:
    return Task("q", "who?", answer="x", info={"relevant_chunks": ["c1", "c2", "c3", "c4"], "answer_chunk_ids": ["c3"],
                                              **info})  # fmt: skip


def test_context1_golden_and_beta_annealed_between_epochs(build) -> None:
    reward = context1()
    b = build()
    for _ in range(5):
        b.turn(("prune_chunks", {"chunk_ids": ["y"]}, "pruned"))
    traj = b.answer("c1 c2 x", output_chunks=["c1", "c2", "x"], seen_chunks=["c1", "c2", "c3", "x", "y"])
    out = weigh(reward, traj, search_task())
    f4 = 17 * (2 / 3) * 0.5 / (16 * (2 / 3) + 0.5)
    assert math.isclose(out["f_beta"], 0.7 * f4) and math.isclose(f4, f_beta(2 / 3, 0.5, 4.0))
    assert math.isclose(out["trajectory_recall"], 0.3 * 0.75) and out["answer_found"] == 1.0
    assert math.isclose(out["prune_penalty"], -0.2) and out["turn_penalty"] == 0.0 and out["clamp"] == 0.0
    assert math.isclose(total(out), 0.7 * f4 + 0.225 + 1.0 - 0.2)
    assert math.isclose(weigh(reward, traj, search_task(), Clock(epoch=2))["f_beta"], 0.7 * f_beta(2 / 3, 0.5, 3.0))
    assert math.isclose(weigh(reward, traj, search_task(), Clock(epoch=5))["f_beta"], 0.7 * f_beta(2 / 3, 0.5, 2.0))


def test_context1_fact_level_recall_and_clamp(build) -> None:
    task = search_task(facts=[{"chunk_ids": ["c1", "c5"]}, {"chunk_ids": ["c3"]}])
    traj = build().answer("c5 x", output_chunks=["c5", "x"], seen_chunks=["c5", "x"])
    out = weigh(context1(), traj, task)
    assert math.isclose(out["f_beta"], 0.7 * f_beta(0.5, 0.5, 4.0)) and out["answer_found"] == 0.0
    b = build()
    for _ in range(130):
        b.turn(("prune_chunks", {"chunk_ids": ["z"]}, "pruned"))
    flooded = b.answer("nothing", output_chunks=[], seen_chunks=["c1"])
    out = weigh(context1(), flooded, search_task())
    assert out["turn_penalty"] == -0.5 and out["prune_penalty"] == -0.5
    assert math.isclose(total(out), 0.01)  # floored at epsilon: it completed, and r_pre = 0.075 > epsilon


def swarm(n: int, *, parallel: bool, answer: str = "x", critical: float | None = None) -> Trajectory:
    """n children with distinct answers, launched in one turn (parallel) or one per turn; the wall-clock run
    intervals are for seed_weighted's ``ParallelCredit``."""
    kids = [
        Trajectory(info={"turn": 0 if parallel else i, "final_answer": f"part {i}",
                         "started_at": 0.0 if parallel else i, "ended_at": 1.0 if parallel else i + 1})  # fmt: skip
        for i in range(n)
    ]
    traj = Trajectory(task_id="q", children=kids, info={"final_answer": answer}, terminated=True)
    if critical is not None:
        traj.metrics["critical_steps"] = critical
    return traj


def test_parl_golden_annealing_and_empty_spawns_never_beat_an_honest_solve() -> None:
    rubric = parl(k=4, lambda_parallel=0.3, lambda_finish=0.2, anneal_steps=1000)
    task = Task("q", "q", answer="x")
    at = {"step": 0}

    def reward(traj: Trajectory, task: Task) -> dict:
        return weigh(rubric, traj, task, Clock(at["step"]))

    # no critical steps recorded: the efficiency term does not apply (None)
    expected = {"perf": 1.0, "parallel": 0.225, "finish": 0.2, "efficiency": None}
    assert reward(swarm(3, parallel=True), task) == pytest.approx(expected)
    assert reward(swarm(3, parallel=False), task)["parallel"] == 0.0  # serial: no parallel credit
    # 4 critical steps of a budget of 100: efficiency 0.1 x 0.96 (not annealed)
    expected = {"perf": 1.0, "parallel": 0.225, "finish": 0.2, "efficiency": 0.096}
    assert reward(swarm(3, parallel=True, critical=4), task) == pytest.approx(expected)
    at["step"] = 500
    expected = {"perf": 1.0, "parallel": 0.1125, "finish": 0.1, "efficiency": None}
    assert reward(swarm(3, parallel=True), task) == pytest.approx(expected)
    at["step"] = 1000
    assert total(reward(swarm(3, parallel=True), task)) == 1.0
    assert total(reward(swarm(3, parallel=True, critical=4), task)) == pytest.approx(1.096)
    assert total(reward(swarm(3, parallel=False, critical=10), task)) == pytest.approx(1.09)  # serial: slower
    at["step"] = 0
    spawner = swarm(8, parallel=True, answer="wrong")
    assert total(reward(spawner, task)) < total(reward(Trajectory(info={"final_answer": "x"}), task))
    cosine = parl(anneal="cosine", anneal_steps=100)
    assert cosine.weights(Clock(50)) == pytest.approx({"perf": 1.0, "parallel": 0.15, "finish": 0.1, "efficiency": 0.1})
    with pytest.raises(ValueError, match="sum to less than 1"):
        parl(lambda_parallel=0.6, lambda_finish=0.4)


def test_seed_weighted_golden_annealing_and_group_stability(build) -> None:
    rubric = seed_weighted(k=4, efficiency_anneal_steps=100)
    task = Task("q", "2 x apple", answer="6")
    at = {"step": 0}

    def reward(traj: Trajectory, task: Task) -> dict:
        return weigh(rubric, traj, task, Clock(at["step"]))

    honest = build("2 x apple").turn(("price", {"item": "apple"}, "3")).turn(("calc", {}, "6")).answer("6")
    out = reward(honest, task)
    assert out == {"completion": 0.4, "efficiency": 0.0, "busy_work": 0.0, "stability": None, "grounding_cap": 0.0}
    at["step"] = 100
    assert rubric.weights(Clock(100))["efficiency"] == pytest.approx(0.05)
    swarm_traj = swarm(4, parallel=True, answer="6")
    assert reward(swarm_traj, task)["efficiency"] == pytest.approx(0.05)
    group = [honest, build("2 x apple").turn(("calc", {}, "6")).answer("6"), build().turn(("c", {}, "7")).answer("7")]
    for traj in group:
        traj.group_id, traj.terms = "g", rubric.measure(traj, task)
    score(group, rubric, Clock(100), task_of=lambda _: task)
    assert [t.rewards["stability"] for t in group] == pytest.approx([0.15, 0.15, 0.0])
    assert [t.reward for t in group] == pytest.approx([0.55, 0.55, 0.0])


def test_seed_weighted_pays_useful_parallelism_on_the_step_clock_not_wall_clock_overlap() -> None:
    """Issue 18: seed_weighted's efficiency is PARL's step-clock credit, like the default swarm reward."""
    rubric = seed_weighted(k=4)
    task = Task("q", "q", answer="6")

    def reward(traj: Trajectory, task: Task) -> dict:
        return weigh(rubric, traj, task)

    assert reward(swarm(4, parallel=True, answer="6"), task)["efficiency"] == pytest.approx(0.3)
    dummies = swarm(4, parallel=True, answer="6")
    for child in dummies.children:  # four sub-agents running at once, each replying nothing
        child.info["final_answer"] = "ANSWER: unknown"
    assert reward(dummies, task)["efficiency"] == 0.0  # the wall-clock ParallelCredit paid 0.3 here
    repeated = swarm(4, parallel=True, answer="6")
    for child in repeated.children:  # one row assigned four times
        child.info["final_answer"] = "part 0"
    assert reward(repeated, task)["efficiency"] == 0.0
    serial = swarm(4, parallel=False, answer="6")
    for i, child in enumerate(serial.children):  # overlapping in wall-clock time, one per turn in steps
        child.info.update(started_at=0.0, ended_at=1.0 + i)
    assert reward(serial, task)["efficiency"] == 0.0


def test_composer_golden(build) -> None:
    def reward(traj: Trajectory) -> dict:
        return weigh(composer(), traj)

    b = (
        build()
        .turn(("write_file", {}, "ok"), ("nope", {}, "Unknown tool 'nope'. Available tools: x."))
        .turn(("run_tests", {}, "4 passed"))
    )
    out = reward(b.answer("done", tests_passed=3, tests_total=4, test_coverage=0.4, tests_tampered=False))
    assert out["tests"] == 0.75 and out["valid_tool_use"] == pytest.approx(0.1 * 2 / 3)
    assert out["effort"] == pytest.approx(-0.1 * 0.75)  # 3 calls, k=1, q=2: 3/4
    assert out["trivial_tests"] == pytest.approx(-0.5 * math.expm1(1.5) / math.expm1(3.0))
    assert out["tests_intact_cap"] == 0.0
    tampered = reward(b.answer("done", tests_passed=4, tests_total=4, tests_tampered=True))
    assert total(tampered) == 0.0 and tampered["tests_intact_cap"] < 0
    nothing_collected = reward(b.answer("done", tests_passed=0, tests_total=0))
    assert nothing_collected["tests"] == 0.0 and nothing_collected["trivial_tests"] is None


def test_presets_by_name() -> None:
    assert set(PRESETS) == {"context1", "parl", "seed_weighted", "composer"}
    assert make_reward("parl", k=2).weights(Clock())["parallel"] == 0.3
    with pytest.raises(ValueError, match="unknown reward preset 'kimi'; presets: context1, parl"):
        make_reward("kimi")
