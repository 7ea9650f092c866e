"""Golden values and range properties for the pure reward formulas (F-beta, effort penalty, PARL terms)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskrl.rewards.formulas import (
    effort_penalty,
    f_beta,
    f_beta_sets,
    prune_penalty,
    r_finish,
    r_parallel,
    turn_penalty,
)
from taskrl.scoring import context1_clamp

unit = st.floats(0.0, 1.0)


def test_f_beta_golden_values() -> None:
    assert f_beta(0.5, 0.5, 4.0) == 0.5
    assert math.isclose(f_beta(1.0, 0.5, 2.0), 2.5 / 4.5)
    assert math.isclose(f_beta(0.25, 1.0, 4.0), 0.85)  # recall-heavy beta forgives low precision
    assert math.isclose(f_beta(1.0, 0.25, 4.0), 4.25 / 16.25)  # ...but not low recall
    assert math.isclose(f_beta(0.5, 1.0, 1.0), 2 / 3)  # beta = 1 is F1
    assert f_beta(0.0, 0.0, 4.0) == 0.0 and f_beta(0.0, 1.0, 2.0) == 0.0


def test_f_beta_rejects_bad_inputs_naming_them() -> None:
    with pytest.raises(ValueError, match="precision"):
        f_beta(1.5, 0.5, 2.0)
    with pytest.raises(ValueError, match="recall"):
        f_beta(0.5, -0.1, 2.0)
    with pytest.raises(ValueError, match="beta"):
        f_beta(0.5, 0.5, 0.0)


def test_f_beta_sets_golden_and_edge_cases() -> None:
    f, p, r = f_beta_sets({"a", "b", "c", "d"}, {"a", "e"}, 2.0)
    assert (p, r) == (0.25, 0.5) and math.isclose(f, 5 * 0.125 / (4 * 0.25 + 0.5))
    assert f_beta_sets(set(), {"a"}, 4.0) == (0.0, 0.0, 0.0)
    assert f_beta_sets({"a"}, set(), 4.0) == (0.0, 0.0, 0.0)
    assert f_beta_sets(set(), set(), 4.0) == (1.0, 1.0, 1.0)


@given(unit, unit, st.floats(0.1, 10.0))
def test_f_beta_in_unit_range_and_between_precision_and_recall(p: float, r: float, beta: float) -> None:
    f = f_beta(p, r, beta)
    assert 0.0 <= f <= 1.0
    if p > 0 and r > 0:
        assert min(p, r) - 1e-12 <= f <= max(p, r) + 1e-12


def test_effort_penalty_golden_values() -> None:
    assert math.isclose(effort_penalty(7.0, 0.3, 0.0), 7.0)  # q = 0 is linear: the effort itself
    assert math.isclose(effort_penalty(1.0, 1.0, 2.0), 0.5)
    assert math.isclose(effort_penalty(3.0, 1.0, 0.5), 2.0)
    assert math.isclose(effort_penalty(math.e - 1, 1.0, 1.0), 1.0)  # the q = 1 limit log(1+kx)/k
    assert effort_penalty(0.0, 2.0, 3.0) == 0.0
    with pytest.raises(ValueError, match="k must"):
        effort_penalty(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="x"):
        effort_penalty(-1.0, 1.0, 1.0)


@given(st.floats(0.0, 1e6), st.floats(1e-3, 10.0), st.floats(0.0, 5.0))
def test_effort_penalty_nonnegative_and_continuous_at_q_one(x: float, k: float, q: float) -> None:
    value = effort_penalty(x, k, q)
    assert value >= 0.0 and math.isfinite(value)
    assert effort_penalty(x + 1.0, k, q) >= value  # more effort never costs less
    assert math.isclose(effort_penalty(x, k, 1.0 + 1e-9), effort_penalty(x, k, 1.0), rel_tol=1e-6, abs_tol=1e-9)


def test_r_parallel_and_r_finish_golden_values() -> None:
    assert r_parallel(0, 4) == 0.0 and r_parallel(2, 4) == 0.5 and r_parallel(9, 4) == 1.0
    assert r_finish(0, 0) == 0.0 and r_finish(3, 4) == 0.75
    with pytest.raises(ValueError, match="cannot exceed"):
        r_finish(5, 4)
    with pytest.raises(ValueError, match="k"):
        r_parallel(1, 0)


def test_context1_penalties_and_clamp_golden_values() -> None:
    assert prune_penalty([3, 2]) == 0.0
    assert math.isclose(prune_penalty([5, 4]), 0.3)  # 2 + 1 calls beyond a streak of 3
    assert prune_penalty([20]) == 0.5  # capped
    assert turn_penalty(64) == 0.0 and turn_penalty(96) == 0.25 and turn_penalty(128) == 0.5 == turn_penalty(500)
    assert context1_clamp(-0.2, 0.6, epsilon=0.01, completed=True) == 0.01
    assert context1_clamp(-0.2, 0.6, epsilon=0.01, completed=False) == 0.0  # failures floor at 0
    assert context1_clamp(-0.2, 0.0, epsilon=0.01, completed=True) == 0.01  # completed beats failed
    assert context1_clamp(0.4, 0.6, epsilon=0.01, completed=True) == 0.4
    assert context1_clamp(0.9, 0.6, epsilon=0.01, completed=True) == 0.6  # never above r_pre
    with pytest.raises(ValueError, match="start < end"):
        turn_penalty(3, start=10, end=10)
