"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from taskrl.rewards.compose import set_training_step


@pytest.fixture(autouse=True)
def _reward_clock_at_step_zero() -> Iterator[None]:
    """Every test starts with the process-wide reward clock at step 0: a trainer test that moved it must not
    anneal the rewards of whatever test runs next."""
    set_training_step(0)
    yield
    set_training_step(0)
