"""validate: a field rule names the first failing field and the value it got."""

from __future__ import annotations

import math

import pytest

from taskrl.validate import above, at_least, finite_at_least, integer_at_least, optional, require


def test_require_names_the_first_failing_field_and_its_value() -> None:
    require("Cfg", "must be >= 1", at_least(1), a=1, b=5)
    with pytest.raises(ValueError, match=r"^Cfg\.b must be >= 1, got 0$"):
        require("Cfg", "must be >= 1", at_least(1), a=1, b=0, c=-1)


def test_rules_reject_nan_wrong_types_and_use_the_given_error() -> None:
    assert not above(0)(0) and above(0)(1e-9) and not above(0)(math.nan) and not at_least(0)(math.nan)
    assert integer_at_least(1)(3) and not integer_at_least(1)(3.0) and not integer_at_least(1)(0)
    assert finite_at_least(0)(0.5) and not finite_at_least(0)(math.inf) and not finite_at_least(0)("1")

    class Bad(ValueError):
        pass

    with pytest.raises(Bad, match="Cfg.x must be finite"):
        require("Cfg", "must be finite", finite_at_least(0), error=Bad, x=math.inf)


def test_optional_accepts_none_and_otherwise_applies_the_rule() -> None:
    assert optional(above(0))(None) and optional(above(0))(2) and not optional(above(0))(0)
    with pytest.raises(ValueError, match=r"^Cfg\.t must be > 0 or None, got -1$"):
        require("Cfg", "must be > 0 or None", optional(above(0)), s=None, t=-1)
