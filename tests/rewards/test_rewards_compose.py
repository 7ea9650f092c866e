"""A reward declared as a ``Rubric``: weighting, None exclusion, schedules, gates, clamp, group terms, stage-wise
credit (``multi_stage``), an env whose default reward is its rubric's measurement, and the removed names."""

from __future__ import annotations

import importlib
import math
import re

import pytest

from taskrl.env import ToolEnv
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.compose import REMOVED, Stage, multi_stage
from taskrl.rewards.terms import ExplorationBonus
from taskrl.rewards.views import call_key, tool_exchanges
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.scoring import (
    ClampRule,
    Clock,
    GateRule,
    RewardTermError,
    Rubric,
    TermWeight,
    batch_metrics,
    make_weight,
    score,
)
from taskrl.tools import tool
from taskrl.types import Task, Trajectory


def const(value: float | None):  # noqa: ANN201 - a term
    return lambda trajectory, task: value


def scored(rubric: Rubric, traj: Trajectory, clock: Clock | None = None) -> Trajectory:
    """Measure ``traj`` with the rubric (as an env's reward does) and score it at ``clock``."""
    traj.terms = rubric.measure(traj, None)
    score([traj], rubric, clock or Clock())
    return traj


def test_weighted_terms_none_is_excluded_not_zero_and_raw_stays_in_terms(build) -> None:
    rubric = Rubric(terms=[TermWeight("a", 2.0, fn=const(0.5)), TermWeight("b", 3.0, fn=const(None)),
                           TermWeight("c", 0.25, fn=const(-1.0))])  # fmt: skip
    traj = scored(rubric, build().answer("x"))
    assert traj.rewards == {"a": 1.0, "b": None, "c": -0.25} and traj.reward == 0.75
    assert traj.terms == {"a": 0.5, "b": None, "c": -1.0}


def test_weight_schedules_follow_step_and_epoch_clocks() -> None:
    rubric = Rubric(terms=[
        TermWeight("lin", {"kind": "linear", "start": 0.3, "end": 0.05, "steps": 100}, fn=const(1.0)),
        TermWeight("cos", {"kind": "cosine", "start": 1.0, "end": 0.0, "steps": 10}, fn=const(1.0)),
        TermWeight("stp", {"kind": "step", "boundaries": [2], "values": [1.0, 0.5]}, "epoch", fn=const(1.0)),
    ])  # fmt: skip
    assert rubric.weights(Clock()) == {"lin": 0.3, "cos": 1.0, "stp": 1.0}
    weights = rubric.weights(Clock(50, epoch=2))
    assert math.isclose(weights["lin"], 0.175) and math.isclose(weights["cos"], 0.0, abs_tol=1e-12)
    assert weights["stp"] == 0.5
    assert scored(rubric, Trajectory(), Clock(50, epoch=2)).rewards["lin"] == weights["lin"]


def test_bad_configs_fail_naming_the_field() -> None:
    with pytest.raises(ValueError, match="Rubric term 'x'.weight: unknown schedule kind"):
        Rubric(terms=[TermWeight("x", {"kind": "nope"}, fn=const(1.0))])
    with pytest.raises(ValueError, match="unique"):
        Rubric(terms=[TermWeight("x", fn=const(1.0)), TermWeight("x", fn=const(2.0))])
    with pytest.raises(ValueError, match="clock"):
        TermWeight("x", clock="minute", fn=const(1.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without '/'"):
        TermWeight("a/b", fn=const(1.0))
    with pytest.raises(ValueError, match="fn must be callable"):
        TermWeight("x", fn=1.0)  # type: ignore[arg-type]
    assert make_weight({"kind": "step", "boundaries": [1], "values": [2.0, 3.0]}, field="w")(1) == 3.0


def test_terms_returning_nan_are_named() -> None:
    with pytest.raises(RewardTermError, match="'n' returned nan"):
        Rubric(terms=[TermWeight("n", fn=const(float("nan")))]).measure(Trajectory())


def test_failed_gate_scores_the_episode_as_failure_and_says_why(build) -> None:
    passed = {"ok": True}
    gate = GateRule("grounded", check=lambda trajectory, task: 1.0 if passed["ok"] else 0.0)
    rubric = Rubric(terms=[TermWeight("a", fn=const(1.0)), TermWeight("b", fn=const(0.5))], gates=[gate])
    assert scored(rubric, build().answer("x")).rewards == {"a": 1.0, "b": 0.5, "grounded_cap": 0.0}
    passed["ok"] = False
    traj = scored(rubric, build().answer("x"))
    assert traj.rewards["grounded_cap"] == -1.5 and traj.reward == 0.0
    assert traj.terms["grounded"] == 0.0
    # A gate never raises a reward that is already at or below failure.
    low = Rubric(terms=[TermWeight("a", fn=const(-0.3))], gates=[gate])
    assert scored(low, build().answer("x")).rewards["grounded_cap"] == 0.0
    na = Rubric(terms=[TermWeight("a", fn=const(1.0))], gates=[GateRule("g", check=const(None))])
    assert scored(na, Trajectory()).rewards["g_cap"] is None


def test_clamp_is_context1s_clamp(build) -> None:
    rubric = Rubric(terms=[TermWeight("gain", fn=const(0.6)), TermWeight("penalty", fn=const(-1.0))],
                    clamp=ClampRule(0.01))  # fmt: skip
    out = scored(rubric, build().answer("x")).rewards
    assert math.isclose(out["clamp"], 0.41) and math.isclose(sum(out.values()), 0.01)
    unfinished = scored(rubric, build().answer(None)).rewards  # not completed: floored at 0, not epsilon
    assert math.isclose(unfinished["clamp"], 0.4) and math.isclose(sum(unfinished.values()), 0.0)
    nothing = Rubric(terms=[TermWeight("gain", fn=const(0.0)), TermWeight("p", fn=const(-0.2))], clamp=ClampRule())
    assert math.isclose(scored(nothing, build().answer("x")).reward, 0.01)  # completed beats failed


def test_multi_stage_seed_weights_golden_and_sequential_gating(build) -> None:
    calls: list[str] = []

    def verifier(name: str, value: float | None):  # noqa: ANN202
        def verify(trajectory: Trajectory, task: Task | None) -> float | None:
            calls.append(name)
            return value

        return verify

    stages = [
        Stage("design", verifier("design", 1.0), 0.2),
        Stage("implement", verifier("implement", 0.5), 0.5),
        Stage("verify", verifier("verify", 1.0), 0.3),
    ]
    assert scored(multi_stage(stages), build().answer("x")).rewards == {"design": 0.2, "implement": 0.25,
                                                                        "verify": 0.3}  # fmt: skip
    calls.clear()
    gated = multi_stage(stages, sequential=True, extra_terms=[TermWeight("bonus", 0.1, fn=const(1.0))])
    out = scored(gated, build().answer("x")).rewards
    assert out == {"design": 0.2, "implement": 0.25, "verify": 0.0, "bonus": 0.1}
    assert "verify" not in calls  # verify never ran: its stage could not earn credit
    skip = multi_stage([Stage("a", const(None), 0.5), Stage("b", const(1.0), 0.5)], sequential=True)
    assert scored(skip, build().answer("x")).rewards == {"a": None, "b": 0.5}  # a stage that does not apply
    with pytest.raises(RewardTermError, match="stages score in"):
        scored(multi_stage([Stage("a", const(1.5))]), build().answer("x"))
    with pytest.raises(ValueError, match="at least one stage"):
        multi_stage([])


def test_group_terms_per_group_then_caps(build) -> None:
    gate = GateRule("grounded", check=lambda trajectory, task: float(trajectory.info.get("grounded", True)))
    rubric = Rubric(terms=[TermWeight("correct", fn=const(0.0))], gates=[gate],
                    group_terms=[TermWeight("explore", 0.5, fn=ExplorationBonus())])  # fmt: skip
    group = [
        build().turn(("search", {"q": "a"}, "r")).answer("x"),
        build().turn(("search", {"q": "b"}, "r")).answer("x"),
        build().turn(("read", {"id": 1}, "r")).answer("x", grounded=False),
    ]
    for traj in group:
        traj.group_id, traj.terms = "g", rubric.measure(traj)
    score(group, rubric, Clock())
    assert [t.rewards["explore"] for t in group] == [0.25, 0.25, 0.5]
    assert group[2].rewards["grounded_cap"] == -0.5 and group[2].reward == 0.0  # the cheat stays at failure
    assert group[2].terms["explore"] == 1.0 and group[0].reward == 0.25
    group[0].metrics["invalid_tool_calls"] = 1.0  # invalid calls never beat failure
    score(group, rubric, Clock())
    assert group[0].rewards["invalid_tool_call_cap"] == -0.25 and group[0].reward == 0.0
    alone = build().answer("x")
    alone.terms = rubric.measure(alone)
    score([alone], rubric, Clock())
    assert alone.rewards["explore"] is None  # a group of one gets no group terms


def distinct_calls(trajectory: Trajectory, task: Task | None) -> float:
    return float(len({call_key(e.call) for e in tool_exchanges(trajectory)}))


class CounterEnv(ToolEnv):
    """A tiny env declaring its reward as a rubric: ``ToolEnv.reward`` measures with it."""

    name = "counter"
    rubric = Rubric(terms=[
        TermWeight("correct", fn=lambda t, task: float(t.final_answer == str(task.answer))),
        TermWeight("distinct_calls", 0.5, fn=distinct_calls),
    ])  # fmt: skip

    @tool
    def count(self, word: str) -> str:
        """Count the letters of a word.

        Args:
            word: the word.
        """
        return str(len(word))

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task("t", "How many letters has 'taskrl'?", answer="6")]


async def test_a_rubric_is_the_env_reward_through_the_loop() -> None:
    env = CounterEnv()
    policy = ScriptedPolicy.from_turns([ScriptedPolicy.call("count", word="taskrl"), "6"])
    traj = await run_episode(env, policy, env.tasks()[0], RolloutConfig(), seed=0)
    assert traj.terms == {"correct": 1.0, "distinct_calls": 1.0}
    assert traj.rewards == {"correct": 1.0, "distinct_calls": 0.5} and traj.reward == 1.5


def test_batch_metrics_logs_every_term_weighted_raw_and_weight(build) -> None:
    rubric = Rubric(terms=[TermWeight("a", 0.5, fn=lambda t, task: t.info.get("a")),
                           TermWeight("b", 2.0, fn=const(1.0))])  # fmt: skip
    batch = [scored(rubric, traj) for traj in (build().answer("x", a=1.0), build().answer("x"),
                                                build().answer("x", a=0.0))]  # fmt: skip
    metrics = batch_metrics(batch, rubric, Clock())
    assert {k: v for k, v in metrics.items() if k.startswith("rewards")} == {
        "rewards/total": 6.5 / 3, "rewards/std": pytest.approx(math.sqrt(1 / 18)),
        "rewards/a": 0.25, "rewards/applicable/a": 2 / 3, "rewards/b": 2.0, "rewards/applicable/b": 1.0,
        "rewards_raw/a": 0.5, "rewards_raw/b": 1.0, "rewards/weight/a": 0.5, "rewards/weight/b": 2.0,
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(REMOVED))
def test_a_removed_name_raises_an_error_naming_its_replacement(name: str) -> None:
    for module in ("taskrl.rewards.compose", "taskrl.rewards"):
        with pytest.raises(ImportError, match=f"{module}.{name} was removed .*: use "):
            exec(f"from {module} import {name}", {})  # noqa: S102 - the user's import, verbatim
        with pytest.raises(ImportError, match=re.escape(REMOVED[name])):
            getattr(importlib.import_module(module), name)
