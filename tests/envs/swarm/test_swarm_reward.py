from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.envs.swarm.reward import SwarmRewardConfig, TaskPerformance, swarm_reward
from taskrl.envs.swarm.tasks import WIDE, item_scores, parse_table, render_table, task_performance
from taskrl.scoring import Clock, Rubric, score
from taskrl.types import Task, Trajectory


def weighted(rubric: Rubric, traj: Trajectory, task: Task, step: int = 0) -> dict[str, float | None]:
    """``traj`` measured by ``rubric`` and scored alone at ``step`` (a copy, without the loop's metrics)."""
    copy = dataclasses.replace(traj, terms=rubric.measure(traj, task), rewards={}, metrics={})
    score([copy], rubric, Clock(step))
    return copy.rewards

ITEMS = [{"key": str(i), "answer": f"w{i}"} for i in (1, 2, 3, 4)]
TASK = Task("t", "rows", "| 1 | w1 |", {"kind": WIDE, "items": ITEMS})
GOLD = render_table({str(i): f"w{i}" for i in (1, 2, 3, 4)})


def episode(answer: str, children: int = 0, *, finished: bool = False, overlap: bool = True) -> Trajectory:
    """Children launched in one turn (overlap) or one per turn, answering distinct rows when ``finished``."""
    traj = Trajectory(terminated=True, info={"final_answer": answer, "subagents_created": children})
    for i in range(children):
        child = Trajectory(parent_id=traj.id, trainable=False, terminated=True)
        child.info.update(turn=0 if overlap else i, agent_id=f"a{i}")
        child.info["final_answer"] = f"ANSWER: w{i % 4 + 1}" if finished else ""
        traj.children.append(child)
    return traj


def reward_of(config: SwarmRewardConfig, traj: Trajectory, step: int = 0) -> float:
    return sum(v for v in weighted(swarm_reward(config), traj, TASK, step).values() if v is not None)


def test_item_f1_golden() -> None:
    half = "| 1 | w1 |\n| 2 | W2 |\n| 3 | wrong |\n| 9 | extra |"
    scores = item_scores(TASK, half)
    assert scores["item_precision"] == pytest.approx(2 / 4) and scores["item_recall"] == pytest.approx(2 / 4)
    assert scores["item_f1"] == pytest.approx(0.5)
    assert task_performance(TASK, GOLD) == 1.0 and task_performance(TASK, "no table") == 0.0
    deep = Task("d", "", None, {**TASK.info, "kind": "deep"})
    assert task_performance(deep, half) == 0.0 and task_performance(deep, GOLD) == 1.0


def test_parse_table_accepts_common_forms() -> None:
    assert parse_table("| row | answer |\n|---|---|\n| 01 | `x` |\nRow 2: y\n3: z") == {"1": "`x`", "2": "y", "3": "z"}


@pytest.mark.parametrize("children", [0, 6])
def test_lambda_zero_gives_r_perf(children: int) -> None:
    traj = episode("| 1 | w1 |\n| 2 | w2 |", children, finished=True)
    perf = TaskPerformance()(traj, TASK)
    assert reward_of(SwarmRewardConfig(lambda_parallel=0.0, lambda_finish=0.0), traj) == pytest.approx(perf)
    # annealed to 0 after anneal_steps: the same
    assert reward_of(SwarmRewardConfig(anneal_steps=10), traj, step=10) == pytest.approx(perf)
    assert (reward_of(SwarmRewardConfig(anneal_steps=10), traj, step=0) > perf) == bool(children)


def test_serial_subagents_earn_no_parallel_credit() -> None:
    rubric = swarm_reward(SwarmRewardConfig())
    serial = weighted(rubric, episode(GOLD, 4, finished=True, overlap=False), TASK)
    parallel = weighted(rubric, episode(GOLD, 4, finished=True, overlap=True), TASK)
    assert serial["parallel"] == 0.0 and parallel["parallel"] == pytest.approx(0.3)


@settings(max_examples=60, deadline=None)
@given(
    lp=st.floats(0, 0.69), lf=st.floats(0, 0.3), k=st.integers(1, 8), n=st.integers(0, 32),
    finished=st.booleans(), step=st.integers(0, 50),
)  # fmt: skip
def test_spawning_subagents_never_beats_an_honest_solve(
    lp: float, lf: float, k: int, n: int, finished: bool, step: int
) -> None:
    config = SwarmRewardConfig(lambda_parallel=lp, lambda_finish=lf, k=k, anneal_steps=40)
    spam = reward_of(config, episode("| 1 | nothing |", n, finished=finished), step)
    honest = reward_of(config, episode(GOLD), step)
    assert spam < honest


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="lambda_parallel"):
        SwarmRewardConfig(lambda_parallel=0.6, lambda_finish=0.4)
    with pytest.raises(ValueError, match="SwarmRewardConfig.k"):
        SwarmRewardConfig(k=0)
