"""Shared fixtures for policy tests: one tiny random model per session, a fresh HFPolicy per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.policies.models import tiny_model


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """(model, tokenizer); shared, so tests must not change the weights."""
    return tiny_model(seed=0)


@pytest.fixture(params=["continuous", "static"])
def hf_policy(tiny: tuple[Any, Any], request: pytest.FixtureRequest) -> Iterator[HFPolicy]:
    """A fresh policy per test, once per decode engine: both must keep every guarantee."""
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, device="auto", engine_config=EngineConfig(engine=request.param))
    yield policy
    policy.close()
