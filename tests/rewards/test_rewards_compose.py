"""ComposedReward and MultiStageReward: weighting, None exclusion, schedules, gates, clamp, group terms."""

from __future__ import annotations

import math

import pytest

from taskrl.env import ToolEnv
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.compose import (
    RAW_PREFIX,
    ComposedReward,
    Gate,
    MultiStageReward,
    PenaltyClamp,
    RewardClock,
    RewardTermError,
    Stage,
    WeightedTerm,
    make_weight,
    reward_metrics,
)
from taskrl.rewards.terms import ExplorationBonus
from taskrl.rewards.views import call_key, tool_exchanges
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.tools import tool
from taskrl.types import Task, Trajectory


def const(value: float | None):  # noqa: ANN201 - a term
    return lambda trajectory, task: value


def test_weighted_terms_none_is_excluded_not_zero_and_raw_goes_to_metrics(build) -> None:
    reward = ComposedReward(
        [WeightedTerm("a", const(0.5), 2.0), WeightedTerm("b", const(None), 3.0), WeightedTerm("c", const(-1.0), 0.25)],
        clock=RewardClock(),
    )
    traj = build().answer("x")
    out = reward(traj)
    assert out == {"a": 1.0, "b": None, "c": -0.25}
    traj.rewards = out
    assert traj.reward == 0.75
    assert traj.metrics == {RAW_PREFIX + "a": 0.5, RAW_PREFIX + "c": -1.0}


def test_weight_schedules_follow_step_and_epoch_clocks() -> None:
    clock = RewardClock()
    reward = ComposedReward(
        [
            WeightedTerm("lin", const(1.0), {"kind": "linear", "start": 0.3, "end": 0.05, "steps": 100}),
            WeightedTerm("cos", const(1.0), {"kind": "cosine", "start": 1.0, "end": 0.0, "steps": 10}),
            WeightedTerm("stp", const(1.0), {"kind": "step", "boundaries": [2], "values": [1.0, 0.5]}, clock="epoch"),
        ],
        clock=clock,
    )
    assert reward.weights() == {"lin": 0.3, "cos": 1.0, "stp": 1.0}
    reward.set_step(50, epoch=2)
    weights = reward.weights()
    assert math.isclose(weights["lin"], 0.175) and math.isclose(weights["cos"], 0.0, abs_tol=1e-12)
    assert weights["stp"] == 0.5
    assert reward(Trajectory())["lin"] == weights["lin"]


def test_each_reward_has_its_own_clock_moved_only_by_set_step() -> None:
    """No process-wide clock: one reward's (or a test's) step never anneals another reward (issue 15)."""
    spec = {"kind": "linear", "start": 1.0, "end": 0.0, "steps": 10}
    first, second = (ComposedReward([WeightedTerm("w", const(1.0), spec)]) for _ in range(2))
    first.set_step(5)
    assert first.weights()["w"] == 0.5
    assert second.weights()["w"] == 1.0  # untouched: the step is an argument, never a global
    shared = RewardClock()
    a, b = (ComposedReward([WeightedTerm("w", const(1.0), spec)], clock=shared) for _ in range(2))
    a.set_step(10)
    assert b.weights()["w"] == 0.0  # rewards given one clock move together


def test_bad_configs_fail_naming_the_field() -> None:
    with pytest.raises(ValueError, match="WeightedTerm 'x'.weight: unknown schedule kind"):
        WeightedTerm("x", const(1.0), {"kind": "nope"})
    with pytest.raises(ValueError, match="unique"):
        ComposedReward([WeightedTerm("x", const(1.0)), WeightedTerm("x", const(2.0))])
    with pytest.raises(ValueError, match="clock"):
        WeightedTerm("x", const(1.0), clock="minute")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without '/'"):
        WeightedTerm("a/b", const(1.0))
    assert make_weight({"kind": "step", "boundaries": [1], "values": [2.0, 3.0]}, field="w")(1) == 3.0


def test_terms_returning_garbage_are_named() -> None:
    def bounded(trajectory: Trajectory, task: Task | None) -> float:
        return 2.0

    bounded.value_range = (0.0, 1.0)  # type: ignore[attr-defined]
    with pytest.raises(RewardTermError, match="'b' returned 2.0, outside"):
        ComposedReward([WeightedTerm("b", bounded)])(Trajectory())
    with pytest.raises(RewardTermError, match="'n' returned nan"):
        ComposedReward([WeightedTerm("n", const(float("nan")))])(Trajectory())
    with pytest.raises(RewardTermError, match="'s' returned str"):
        ComposedReward([WeightedTerm("s", const("1"))])(Trajectory())  # type: ignore[arg-type]


def test_failed_gate_scores_the_episode_as_failure_and_says_why(build) -> None:
    passed = {"ok": True}
    gate = Gate("grounded", lambda trajectory, task: 1.0 if passed["ok"] else 0.0)
    reward = ComposedReward([WeightedTerm("a", const(1.0)), WeightedTerm("b", const(0.5))], gates=[gate])
    assert reward(build().answer("x")) == {"a": 1.0, "b": 0.5, "grounded_cap": 0.0}
    passed["ok"] = False
    traj = build().answer("x")
    out = reward(traj)
    assert out["grounded_cap"] == -1.5 and sum(v for v in out.values() if v is not None) == 0.0
    assert traj.metrics[RAW_PREFIX + "grounded"] == 0.0
    # A gate never raises a reward that is already at or below failure.
    low = ComposedReward([WeightedTerm("a", const(-0.3))], gates=[gate])
    assert low(build().answer("x"))["grounded_cap"] == 0.0
    assert (
        ComposedReward([WeightedTerm("a", const(1.0))], gates=[Gate("g", const(None))])(Trajectory())["g_cap"] is None
    )


def test_penalty_clamp_is_context1s_clamp(build) -> None:
    terms = [WeightedTerm("gain", const(0.6)), WeightedTerm("penalty", const(-1.0))]
    reward = ComposedReward(terms, clamp=PenaltyClamp(0.01))
    out = reward(build().answer("x"))
    assert math.isclose(out["clamp"], 0.41) and math.isclose(sum(out.values()), 0.01)
    unfinished = reward(build().answer(None))  # not completed: floored at 0, not epsilon
    assert math.isclose(unfinished["clamp"], 0.4) and math.isclose(sum(unfinished.values()), 0.0)
    nothing = ComposedReward([WeightedTerm("gain", const(0.0)), WeightedTerm("p", const(-0.2))], clamp=PenaltyClamp())
    assert math.isclose(sum(nothing(build().answer("x")).values()), 0.01)  # completed beats failed


def test_multistage_seed_weights_golden_and_sequential_gating(build) -> None:
    calls: list[str] = []

    def verifier(name: str, score: float | None):  # noqa: ANN202
        def verify(trajectory: Trajectory, task: Task | None) -> float | None:
            calls.append(name)
            return score

        return verify

    stages = [
        Stage("design", verifier("design", 1.0), 0.2),
        Stage("implement", verifier("implement", 0.5), 0.5),
        Stage("verify", verifier("verify", 1.0), 0.3),
    ]
    out = MultiStageReward(stages)(build().answer("x"))
    assert out == {"design": 0.2, "implement": 0.25, "verify": 0.3}
    calls.clear()
    gated = MultiStageReward(stages, sequential=True, extra_terms=[WeightedTerm("bonus", const(1.0), 0.1)])
    out = gated(build().answer("x"))
    assert out == {"design": 0.2, "implement": 0.25, "verify": 0.0, "bonus": 0.1}
    assert calls == ["design", "implement"]  # verify never ran: its stage could not earn credit
    skip = MultiStageReward([Stage("a", const(None), 0.5), Stage("b", const(1.0), 0.5)], sequential=True)
    assert skip(build().answer("x")) == {"a": None, "b": 0.5}  # a stage that does not apply blocks nothing
    with pytest.raises(RewardTermError, match="stages score in"):
        MultiStageReward([Stage("a", const(1.5))])(build().answer("x"))


def test_group_terms_added_by_finalize_group_and_caps_reapplied(build) -> None:
    gate = Gate("grounded", lambda trajectory, task: float(trajectory.info.get("grounded", True)))
    reward = ComposedReward(
        [WeightedTerm("correct", const(0.0))], group_terms=[WeightedTerm("explore", ExplorationBonus(), 0.5)],
        gates=[gate],
    )  # fmt: skip
    group = [
        build().turn(("search", {"q": "a"}, "r")).answer("x"),
        build().turn(("search", {"q": "b"}, "r")).answer("x"),
        build().turn(("read", {"id": 1}, "r")).answer("x", grounded=False),
    ]
    for traj in group:
        traj.rewards = reward(traj)
    reward.finalize_group(group)
    assert [t.rewards["explore"] for t in group] == [0.25, 0.25, 0.5]
    assert group[2].rewards["grounded_cap"] == -0.5 and group[2].reward == 0.0  # the cheat stays at failure
    assert group[2].metrics[RAW_PREFIX + "explore"] == 1.0 and group[0].reward == 0.25
    # The loop's invalid-call cap is recomputed too: invalid calls never beat failure.
    pair = [group[0], group[2]]
    group[0].metrics["invalid_tool_calls"] = 1.0
    group[2].info["grounded"] = True
    for traj in pair:
        traj.rewards = reward(traj)
    reward.finalize_group(pair)
    assert group[0].rewards["invalid_tool_call_cap"] == -0.5 and group[0].reward == 0.0
    assert group[2].reward == 0.5 and "invalid_tool_call_cap" not in group[2].rewards


def distinct_calls(trajectory: Trajectory, task: Task | None) -> float:
    return float(len({call_key(e.call) for e in tool_exchanges(trajectory)}))


class CounterEnv(ToolEnv):
    """A tiny env whose reward is a ComposedReward, as envs are meant to use it."""

    name = "counter"

    def __init__(self) -> None:
        super().__init__()
        correct = WeightedTerm("correct", lambda t, task: float(t.final_answer == str(task.answer)))
        self.composed = ComposedReward([correct, WeightedTerm("distinct_calls", distinct_calls)], clock=RewardClock())

    @tool
    def count(self, word: str) -> str:
        """Count the letters of a word.

        Args:
            word: the word.
        """
        return str(len(word))

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task("t", "How many letters has 'taskrl'?", answer="6")]

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return self.composed(trajectory, self.task)


async def test_composed_reward_as_env_reward_through_the_loop() -> None:
    env = CounterEnv()
    policy = ScriptedPolicy.from_turns([ScriptedPolicy.call("count", word="taskrl"), "6"])
    traj = await run_episode(env, policy, env.tasks()[0], RolloutConfig(), seed=0)
    assert traj.rewards == {"correct": 1.0, "distinct_calls": 1.0} and traj.reward == 2.0
    assert traj.metrics[RAW_PREFIX + "correct"] == 1.0 and traj.metrics["tool_calls"] == 1


def test_reward_metrics_logs_every_term_weighted_raw_and_weight(build) -> None:
    reward = ComposedReward(
        [WeightedTerm("a", lambda t, task: t.info.get("a"), 0.5), WeightedTerm("b", const(1.0), 2.0)],
        clock=RewardClock(),
    )
    batch = [build().answer("x", a=1.0), build().answer("x"), build().answer("x", a=0.0)]
    for traj in batch:
        traj.rewards = reward(traj)
    metrics = reward_metrics(batch, reward)
    assert metrics == {
        "rewards/total": 6.5 / 3, "rewards/a": 0.25, "rewards/applicable/a": 2 / 3, "rewards/b": 2.0,
        "rewards/applicable/b": 1.0, "rewards_raw/a": 0.5, "rewards_raw/b": 1.0, "rewards/weight/a": 0.5,
        "rewards/weight/b": 2.0,
    }  # fmt: skip
    assert reward_metrics([]) == {}
