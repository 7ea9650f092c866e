"""Schedules: golden values for the seed defaults, config parsing and field-named errors."""

import math

import pytest

from taskrl.algos.schedules import Constant, Cosine, Linear, Piecewise, make_schedule, three_phase_lr


def test_seed_entropy_schedule_linear_001_to_0001() -> None:
    s = make_schedule({"kind": "linear", "start": 0.01, "end": 0.001, "steps": 100})
    assert s(0) == 0.01 and math.isclose(s(50), 0.0055) and s(100) == 0.001 and s(10_000) == 0.001


def test_cosine_endpoints_midpoint_and_warmup() -> None:
    s = Cosine(3e-5, 1e-6, steps=100)
    assert s(0) == 3e-5 and math.isclose(s(50), (3e-5 + 1e-6) / 2) and s(100) == 1e-6 and s(1000) == 1e-6
    w = Cosine(1.0, 0.0, steps=10, warmup=4)
    assert [w(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0] and w(4) == 1.0


def test_three_phase_and_piecewise() -> None:
    s = three_phase_lr()
    assert (s(0), s(9_999), s(10_000), s(99_999), s(100_000)) == (5e-5, 5e-5, 1e-5, 1e-5, 5e-6)
    assert make_schedule({"kind": "piecewise", "boundaries": [2], "values": [1.0, 0.0]})(2) == 0.0
    with pytest.raises(ValueError, match="one more value"):
        Piecewise((1, 2), (1.0,))


def test_make_schedule_accepts_numbers_and_schedules_and_names_the_field() -> None:
    assert make_schedule(0.5) == Constant(0.5)
    lin = Linear(1, 0, 10)
    assert make_schedule(lin) is lin
    with pytest.raises(ValueError, match="lr: unknown schedule kind 'nope'"):
        make_schedule({"kind": "nope"}, field="lr")
    with pytest.raises(ValueError, match="entropy_coef: bad arguments"):
        make_schedule({"kind": "linear", "start": 1}, field="entropy_coef")
    with pytest.raises(ValueError, match="steps >= 1"):
        Linear(1, 0, 0)
