"""The eval gate: bootstrap CI of a difference of means, the per-metric verdict, N consecutive wins, env suites."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.deploy.gate import ConsecutiveWins, GateConfig, bootstrap_diff_ci, evaluate_env, gate_decision
from taskrl.envs.builtin import ShopEnv
from taskrl.policies.scripted import ScriptedPolicy


def test_constant_samples_give_a_point_interval() -> None:
    assert bootstrap_diff_ci([1.0] * 5, [3.0] * 7) == (2.0, 2.0, 2.0)
    assert bootstrap_diff_ci([1.0, 2.0], [2.0, 3.0], paired=True) == (1.0, 1.0, 1.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=2, max_size=30), st.lists(st.floats(-10, 10), min_size=2, max_size=30))
def test_interval_contains_the_observed_difference(base: list[float], cand: list[float]) -> None:
    diff, lower, upper = bootstrap_diff_ci(base, cand, n_boot=200)
    assert lower - 1e-9 <= upper
    assert min(cand) - max(base) - 1e-9 <= lower and upper <= max(cand) - min(base) + 1e-9
    assert lower - 1e-6 <= diff <= upper + 1e-6 or len(base) < 5 or len(cand) < 5


def test_gate_blocks_a_worse_candidate_and_passes_an_equal_one() -> None:
    rng = random.Random(0)
    base = [float(rng.random() < 0.8) for _ in range(200)]
    worse = [float(rng.random() < 0.5) for _ in range(200)]
    same = [float(rng.random() < 0.8) for _ in range(200)]
    blocked = gate_decision({"reward": base}, {"reward": worse})
    assert not blocked.promote and "reward" in blocked.reason and blocked.evidence["reward"]["ci"][1] < 0
    assert gate_decision({"reward": base}, {"reward": same}).promote
    # lower_is_better flips the sign: more invalid calls is the regression.
    config = GateConfig(lower_is_better=("invalid",))
    assert not gate_decision({"invalid": worse}, {"invalid": base}, config).promote
    assert gate_decision({"invalid": base}, {"invalid": worse}, config).promote


def test_gate_needs_evidence() -> None:
    assert not gate_decision({"reward": [1.0]}, {"reward": [1.0]}).promote
    assert "accuracy" in gate_decision({"reward": [1.0, 1.0]}, {"accuracy": [1.0, 1.0]}).reason
    with pytest.raises(ValueError, match="confidence"):
        GateConfig(confidence=1.5)


def test_consecutive_wins_resets_on_a_loss() -> None:
    rule = ConsecutiveWins(3)
    assert [rule.update(w) for w in (True, True, False, True, True, True)] == [False] * 5 + [True]
    assert rule.evidence()["sessions"] == 6


async def test_env_suite_tells_the_expert_from_a_quitter() -> None:
    expert = ScriptedPolicy(ShopEnv.scripted_rule, name="expert")
    quitter = ScriptedPolicy(lambda messages, tools: "I don't know.", name="quitter")
    good = await evaluate_env("shop", expert, n_tasks=8)
    bad = await evaluate_env("shop", quitter, n_tasks=8)
    assert len(good["reward"]) == 8 and sum(good["reward"]) > sum(bad["reward"])
    assert not gate_decision(good, bad).promote


def test_t_quantile_matches_student_t_and_welch_pays_for_a_small_sample() -> None:
    from taskrl.deploy.gate import t_quantile, welch_diff_ci

    for (q, df), exact in {(0.975, 7): 2.3646, (0.99375, 7): 3.3353, (0.975, 30): 2.0423, (0.995, 5): 4.0321}.items():
        assert t_quantile(q, df) == pytest.approx(exact, rel=0.007)
    assert welch_diff_ci([1.0] * 5, [3.0] * 7) == (2.0, 2.0, 2.0)
    # 1 success in 8 (+-1 rewards) against an even stable: the sample variance (0.5) understates the spread, so
    # the pooled floor widens the 95% interval past 0 (not shown worse); the plain Welch one ends at -0.1.
    stable, candidate = [1.0, -1.0] * 20, [1.0] + [-1.0] * 7
    diff, lower, upper = welch_diff_ci(stable, candidate, confidence=0.95)
    assert diff == -0.75 and lower < -0.75 < upper and upper > 0
    with pytest.raises(ValueError, match="at least two"):
        welch_diff_ci([1.0], [1.0, 2.0])
