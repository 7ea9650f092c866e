"""taskrl.scoring: one score, in order (weights, group terms, clamp, gates, invalid-call cap), idempotent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.scoring import (
    ClampRule,
    Clock,
    GateRule,
    Rubric,
    TermWeight,
    batch_metrics,
    score,
)
from taskrl.types import Trajectory


def test_a_cheat_never_beats_a_failure_under_heavier_weights() -> None:
    """The defect of issue 15: weights applied after the gates let ``{"tests": 1, "tests_intact_cap": -1}``
    (total 0) score 1.0 under ``reward_weights={"tests": 2}``."""
    legacy = Trajectory(rewards={"tests": 1.0, "tests_intact_cap": -1.0})
    score([legacy], Rubric(), Clock(), reward_weights={"tests": 2.0})
    assert legacy.reward == pytest.approx(0.0)
    declared = Trajectory(terms={"tests": 1.0, "tests_intact": 0.0})
    score([declared], Rubric(gates=[GateRule("tests_intact")]), Clock(), reward_weights={"tests": 2.0})
    assert declared.rewards["tests"] == 2.0 and declared.reward == pytest.approx(0.0)


def test_weights_follow_the_explicit_clock_and_rescoring_is_idempotent() -> None:
    rubric = Rubric(terms=[TermWeight("a", {"kind": "linear", "start": 4.0, "end": 0.0, "steps": 4}, "epoch")])
    traj = Trajectory(terms={"a": 1.0, "b": 0.5})
    score([traj], rubric, Clock(step=9, epoch=1))
    assert traj.rewards == {"a": 3.0, "b": 0.5}
    score([traj], rubric, Clock(step=9, epoch=1))
    assert traj.rewards == {"a": 3.0, "b": 0.5}


def test_group_terms_then_clamp_then_gates_then_invalid_cap() -> None:
    def rank(group, task):  # noqa: ANN001, ANN202 - a group term
        return [0.1 * i for i in range(len(group))]

    rubric = Rubric(group_terms=[TermWeight("rank", 2.0, fn=rank)], clamp=ClampRule(0.01), gates=[GateRule("ok")])
    group = [Trajectory(group_id="g", terms={"x": 0.5, "ok": 1.0}) for _ in range(3)]
    group[2].terms["ok"] = 0.0
    group[1].metrics["invalid_tool_calls"] = 1
    score(group, rubric, Clock())
    assert group[0].rewards["rank"] == 0.0 and group[0].reward == pytest.approx(0.5)
    assert group[1].rewards["rank"] == pytest.approx(0.2) and group[1].reward == pytest.approx(0.0)
    assert group[2].rewards["ok_cap"] < 0 and group[2].reward == pytest.approx(0.0)
    alone = [Trajectory(id=t.id, group_id="g", terms=dict(t.terms), metrics=dict(t.metrics)) for t in group[:1]]
    score(alone, rubric, Clock())  # a group of one keeps the group term measured with its group
    assert alone[0].rewards["rank"] == 0.0


def test_batch_metrics_is_one_namespace() -> None:
    trajs = [Trajectory(terms={"a": 1.0, "b": None}), Trajectory(terms={"a": 0.0, "b": 2.0})]
    score(trajs, Rubric(terms=[TermWeight("a", 0.5)]), Clock())
    out = batch_metrics(trajs, Rubric(terms=[TermWeight("a", 0.5)]), Clock())
    assert out["rewards/total"] == pytest.approx(1.25)
    assert out["rewards/a"] == 0.25 and out["rewards_raw/a"] == 0.5 and out["rewards/applicable/b"] == 0.5
    assert out["rewards/weight/a"] == 0.5


values = st.floats(-3, 3, allow_nan=False)
weights = st.one_of(
    st.floats(-5, 5, allow_nan=False),
    st.builds(lambda a, b, n: {"kind": "linear", "start": a, "end": b, "steps": n}, values, values, st.integers(1, 9)),
)


@settings(max_examples=300, deadline=None)
@given(
    terms=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.one_of(st.none(), values), min_size=1),
    rubric_weights=st.dictionaries(st.sampled_from(["a", "b", "c"]), weights),
    overrides=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.floats(-10, 10, allow_nan=False)),
    gate_value=st.floats(0, 2, allow_nan=False),
    invalid=st.integers(0, 2),
    failure=st.floats(-1, 1, allow_nan=False),
    clamp=st.booleans(),
    step=st.integers(0, 20),
    epoch=st.integers(0, 5),
)
def test_a_failed_gate_or_an_invalid_call_never_scores_above_failure(
    terms, rubric_weights, overrides, gate_value, invalid, failure, clamp, step, epoch  # noqa: ANN001
) -> None:
    rubric = Rubric(
        terms=[TermWeight(name, w) for name, w in rubric_weights.items()],
        gates=[GateRule("intact", 1.0)],
        clamp=ClampRule(0.01) if clamp else None,
        failure_reward=failure,
    )
    traj = Trajectory(terms={**terms, "intact": gate_value}, metrics={"invalid_tool_calls": float(invalid)})
    traj.info["final_answer"] = "x"
    score([traj], rubric, Clock(step, epoch), reward_weights=overrides)
    if gate_value < 1.0 or invalid:
        assert traj.reward <= failure + 1e-9
    first = dict(traj.rewards)
    score([traj], rubric, Clock(step, epoch), reward_weights=overrides)
    assert traj.rewards == first
