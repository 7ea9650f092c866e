"""taskrl.scoring: one score, in order (weights, group terms, clamp, gates, invalid-call cap), idempotent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.rewards.formulas import f_beta
from taskrl.scoring import (
    ClampRule,
    Clock,
    DerivedTerm,
    GateRule,
    Measure,
    RewardTermError,
    Rubric,
    TermWeight,
    batch_metrics,
    score,
    score_collected,
)
from taskrl.types import Task, Trajectory


def _info(key: str):  # noqa: ANN202 - a term function reading one info key
    return lambda trajectory, task: trajectory.info.get(key)


def test_rubric_measures_its_terms_measures_and_gate_checks_unweighted() -> None:
    rubric = Rubric(
        terms=[TermWeight("a", 3.0, fn=_info("a")), TermWeight("env_measured", 2.0)],
        measures=[Measure("m", _info("m"))],
        gates=[GateRule("ok", check=_info("ok"))],
    )
    traj = Trajectory(info={"a": 0.5, "m": None, "ok": 1.0})
    assert rubric.measure(traj, Task("t", "q")) == {"a": 0.5, "m": None, "ok": 1.0}  # no fn: the env measures it
    traj.terms = {**rubric.measure(traj), "env_measured": 1.0}
    score([traj], rubric, Clock())
    assert traj.rewards == {"a": 1.5, "env_measured": 2.0, "ok_cap": 0.0}  # measures and checks are no rewards

    def bounded(trajectory: Trajectory, task: Task | None) -> float:
        return 2.0

    bounded.value_range = (0.0, 1.0)  # type: ignore[attr-defined]
    with pytest.raises(RewardTermError, match="'b' returned 2.0, outside"):
        Rubric(terms=[TermWeight("b", fn=bounded)]).measure(traj)
    with pytest.raises(RewardTermError, match="'s' returned str"):
        Rubric(terms=[TermWeight("s", fn=lambda t, task: "1")]).measure(traj)  # type: ignore[arg-type,return-value]


def test_a_derived_term_is_computed_at_the_clock_it_is_scored_at() -> None:
    """Context-1's F_β: the env measures precision and recall; β is read at the scoring clock, never the env's."""
    beta = {"kind": "linear", "start": 4.0, "end": 2.0, "steps": 4}
    rubric = Rubric(
        measures=[Measure("p", _info("p")), Measure("r", _info("r"))],
        derived=[DerivedTerm("f", ("p", "r"), f_beta, param=beta, param_clock="epoch", weight=0.7)],
    )
    traj = Trajectory(terms={"p": 0.5, "r": 1.0})
    for epoch, b in ((0, 4.0), (2, 3.0), (9, 2.0)):
        score([traj], rubric, Clock(step=100, epoch=epoch))
        assert traj.terms["f"] == pytest.approx(f_beta(0.5, 1.0, b))
        assert traj.rewards == {"f": pytest.approx(0.7 * f_beta(0.5, 1.0, b))}  # the inputs are no reward terms
    assert batch_metrics([traj], rubric, Clock(epoch=2))["rewards/param/f"] == 3.0
    missing = Trajectory(terms={"p": None, "r": 1.0})
    score([missing], rubric, Clock())
    assert missing.terms["f"] is None and missing.rewards == {"f": None}
    with pytest.raises(ValueError, match="derived term 'f' reads \\['q'\\], which are not in measures"):
        Rubric(measures=[Measure("p", _info("p"))], derived=[DerivedTerm("f", ("p", "q"), f_beta)])
    with pytest.raises(ValueError, match="DerivedTerm 'f'.param: unknown schedule kind"):
        Rubric(measures=[Measure("p", _info("p"))], derived=[DerivedTerm("f", ("p",), abs, param={"kind": "no"})])


def test_a_cheat_never_beats_a_failure_under_heavier_weights() -> None:
    """The defect of issue 15: weights applied after the gates let ``{"tests": 1, "tests_intact_cap": -1}``
    (total 0) score 1.0 under ``reward_weights={"tests": 2}``."""
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


def test_a_score_fn_that_writes_rewards_is_refused_naming_terms() -> None:
    """``score`` writes ``rewards``: a measurement written there would be overwritten, silently, so it is refused."""

    def into_rewards(step: int, trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            t.rewards["bonus"] = 1.0

    def into_terms(step: int, trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            t.terms["bonus"] = 1.0

    batch = [Trajectory(terms={"x": 0.5}, rewards={"x": 0.5})]
    refused = r"score_fn wrote Trajectory.rewards \['bonus'\]: write measurements to Trajectory.terms"
    with pytest.raises(RewardTermError, match=refused):
        score_collected(batch, None, Clock(), rubric=Rubric(), measure=into_rewards)
    batch = [Trajectory(terms={"x": 0.5}, rewards={"x": float("nan")})]
    score_collected(batch, None, Clock(), rubric=Rubric(), measure=into_terms)
    assert batch[0].rewards == {"x": 0.5, "bonus": 1.0}
