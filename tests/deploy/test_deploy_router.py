"""Router unit tests: canary stages advance on samples, stickiness, holdout share, rollback, decision log."""

from __future__ import annotations

import pytest

from taskrl.deploy.router import Router, RouterConfig, RouterError, session_unit
from taskrl.deploy.store import Decision
from taskrl.policies.scripted import ScriptedPolicy


def policy(name: str) -> ScriptedPolicy:
    return ScriptedPolicy(lambda messages, tools: name, name=name)


def make_router(**config: object) -> tuple[Router, list[Decision]]:
    log: list[Decision] = []
    router = Router("m", policy("v0"), RouterConfig(**config), on_decision=log.append)  # type: ignore[arg-type]
    return router, log


def test_stages_advance_then_promote_and_holdout_keeps_the_previous() -> None:
    router, log = make_router(stages=(0.01, 0.05, 0.2, 1.0), min_samples=5, holdout=0.05)
    v1 = router.add_version(policy("v1"))
    router.start_canary(v1)
    shares = []
    for stage in range(4):
        shares.append(sum(router.route(f"s{i}")[1] == "canary" for i in range(20_000)) / 20_000)
        for _ in range(5):
            router.observe(router.stable, 1.0)
            router.observe(v1, 1.0)
        assert router.candidate == (None if stage == 3 else v1)
    for got, want in zip(shares, (0.01, 0.05, 0.2, 1.0), strict=True):
        assert abs(got - want * 0.95) < 0.01
    assert (router.stable, router.previous) == (v1, 0)
    arms = {router.route(f"s{i}") for i in range(5000)}
    assert arms == {(0, "holdout"), (v1, "stable")}
    assert [d.kind for d in log] == ["add_version", "start_canary", "advance", "advance", "advance", "promote"]
    assert log[-1].evidence["candidate_n"] == 20


def test_canary_sessions_stay_on_the_canary_as_it_grows() -> None:
    router, _ = make_router(stages=(0.1, 0.5, 1.0), min_samples=1, holdout=0.0)
    router.start_canary(router.add_version(policy("v1")))
    early = {f"s{i}" for i in range(2000) if router.route(f"s{i}")[1] == "canary"}
    router.observe(1, 1.0)
    later = {f"s{i}" for i in range(2000) if router.route(f"s{i}")[1] == "canary"}
    assert early and early < later
    assert session_unit("abc", "x") == session_unit("abc", "x") != session_unit("abc", "y")


def test_significant_live_regression_rolls_back() -> None:
    router, log = make_router(stages=(0.5, 1.0), min_samples=1000, rollback_min_samples=10)
    v1 = router.add_version(policy("v1"))
    router.start_canary(v1)
    for i in range(40):
        router.observe(0, 1.0 if i % 10 else 0.0)
        decision = router.observe(v1, -1.0 if i % 10 else 0.0)
        if decision is not None:
            break
    assert decision is not None and decision.kind == "rollback"
    assert router.candidate is None and router.route("anyone")[0] == 0
    assert log[-1].evidence["ci"][1] < 0


def test_misuse_is_refused() -> None:
    router, _ = make_router()
    with pytest.raises(RouterError, match="no version 7"):
        router.start_canary(7)
    with pytest.raises(RouterError, match="no candidate"):
        router.rollback()
    with pytest.raises(ValueError, match="stages"):
        RouterConfig(stages=(0.5, 0.2, 1.0))
    with pytest.raises(ValueError, match="holdout"):
        RouterConfig(holdout=0.7)
