"""Router unit tests: canary stages advance on live non-inferiority (never on counts alone), stickiness,
holdout share, rollback, and a decision log that names the candidate."""

from __future__ import annotations

import random
import threading

import pytest

from taskrl.deploy.router import (
    Router,
    RouterConfig,
    RouterError,
    look_confidence,
    rollback_look,
    session_unit,
)
from taskrl.deploy.store import Decision
from taskrl.policies.scripted import ScriptedPolicy


def policy(name: str) -> ScriptedPolicy:
    return ScriptedPolicy(lambda messages, tools: name, name=name)


def make_router(**config: object) -> tuple[Router, list[Decision]]:
    log: list[Decision] = []
    router = Router("m", policy("v0"), RouterConfig(**config), on_decision=log.append)  # type: ignore[arg-type]
    return router, log


def test_stages_advance_then_promote_and_holdout_keeps_the_previous() -> None:
    router, log = make_router(stages=(0.01, 0.05, 0.2, 1.0), min_samples=5, rollback_min_samples=5, holdout=0.05)
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
        assert abs(got - want) < 0.01  # no holdout yet: v0 has no previous policy to hold out on
    assert (router.stable, router.previous) == (v1, 0)
    arms = {router.route(f"s{i}") for i in range(5000)}
    assert arms == {(0, "holdout"), (v1, "stable")}
    assert [d.kind for d in log] == ["add_version", "start_canary", "advance", "advance", "advance", "promote"]
    assert log[-1].evidence["candidate_n"] == 20 and log[-1].evidence["candidate"] == v1
    assert log[-1].evidence["ci"] == [0.0, 0.0]  # promoted on the live test, not on the count


def test_counts_alone_never_advance_a_canary() -> None:
    router, log = make_router(stages=(0.5, 1.0), min_samples=3, rollback_min_samples=30)
    v1 = router.start_canary(router.add_version(policy("v1"))) or 1
    for _ in range(29):  # 29 stage sessions, ten times min_samples, but fewer than the live test needs
        router.observe(0, 1.0)
        assert router.observe(v1, 1.0) is None
    assert router.stage == 0 and router.candidate == v1
    router.observe(0, 1.0)
    assert router.observe(v1, 1.0).kind == "advance"  # type: ignore[union-attr]


def run_canary(stable_p: float, candidate_p: float, seed: int, **config: object) -> tuple[Router, list[Decision]]:
    """Bernoulli live rewards (success 1, failure 0) per session until the canary is decided."""
    router, log = make_router(**config)
    v1 = router.add_version(policy("v1"))
    router.start_canary(v1)
    rng = random.Random(seed)
    for _ in range(5000):
        if router.candidate is None:
            break
        router.observe(0, float(rng.random() < stable_p))
        router.observe(v1, float(rng.random() < candidate_p))
    return router, log


@pytest.mark.parametrize("seed", range(5))
def test_a_degraded_candidate_is_never_promoted_and_a_good_one_is(seed: int) -> None:
    # Small stages and a small live test: before, counts alone carried a degraded canary through every stage.
    config = {"stages": (0.1, 0.5, 1.0), "min_samples": 5, "rollback_min_samples": 5, "holdout": 0.0}
    router, log = run_canary(0.7, 0.3, seed, **config)
    kinds = [d.kind for d in log]
    assert "promote" not in kinds and "advance" not in kinds, kinds
    assert kinds[-1] == "rollback" and router.stable == 0 and router.candidate is None
    assert log[-1].evidence["candidate"] == 1 and log[-1].evidence["ci"][1] < 0
    router, log = run_canary(0.5, 0.6, seed, **{**config, "max_stage_samples": 5000})
    assert [d.kind for d in log][-3:] == ["advance", "advance", "promote"] and router.stable == 1
    for decision in log[-3:]:
        assert decision.evidence["ci"][0] >= -0.1 and decision.evidence["samples"] >= 5


def test_an_inconclusive_stage_rolls_back() -> None:
    # Candidate and stable equal: with advance_margin 0 the lower end stays below 0, so it is never proven.
    router, log = run_canary(0.5, 0.5, 0, stages=(0.5, 1.0), min_samples=10, rollback_min_samples=10,
                             advance_margin=0.0, max_stage_samples=40)  # fmt: skip
    assert [d.kind for d in log][-1] == "rollback" and router.stable == 0
    assert "inconclusive after 40" in log[-1].evidence["reason"]


def test_promote_and_rollback_are_logged_before_the_candidate_is_cleared() -> None:
    seen: list[tuple[str, int | None, int]] = []
    router = Router("m", policy("v0"), RouterConfig(stages=(1.0,), min_samples=2, rollback_min_samples=2))
    router.on_decision = lambda d: seen.append((d.kind, router.candidate, router.stable))
    v1 = router.add_version(policy("v1"))
    router.start_canary(v1)
    router.rollback({"why": "operator"})
    router.start_canary(v1)
    for _ in range(2):
        router.observe(0, 1.0)
        router.observe(v1, 1.0)
    assert seen[-3:] == [("rollback", v1, 0), ("start_canary", v1, 0), ("promote", v1, 0)]
    assert router.decisions[-3].evidence["candidate"] == v1 and router.decisions[-1].evidence["candidate"] == v1
    assert (router.stable, router.candidate) == (v1, None)


def test_canary_sessions_stay_on_the_canary_as_it_grows() -> None:
    router, _ = make_router(stages=(0.1, 0.5, 1.0), min_samples=2, rollback_min_samples=2, holdout=0.0)
    router.start_canary(router.add_version(policy("v1")))
    early = {f"s{i}" for i in range(2000) if router.route(f"s{i}")[1] == "canary"}
    for _ in range(2):
        router.observe(0, 1.0)
        router.observe(1, 1.0)
    assert router.stage == 1
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
    with pytest.raises(ValueError, match="advance_margin"):
        RouterConfig(advance_margin=float("nan"))
    with pytest.raises(ValueError, match="max_stage_samples"):
        RouterConfig(min_samples=10, max_stage_samples=5)
    assert RouterConfig(min_samples=7).max_stage_samples == 70


def test_one_version_has_no_holdout_arm() -> None:
    """With a single version the holdout would be the stable policy under another name: no session gets it."""
    router, _ = make_router(holdout=0.1)
    assert {router.route(f"s{i}") for i in range(5000)} == {(0, "stable")}
    router.activate(router.add_version(policy("v1")))
    arms = [router.route(f"s{i}")[1] for i in range(20_000)]
    assert abs(arms.count("holdout") / 20_000 - 0.1) < 0.01


def test_rollback_looks_double_and_their_error_rates_sum_to_at_most_the_level() -> None:
    assert [rollback_look(n, 8) for n in (7, 8, 15, 16, 31, 32, 64, 1000)] == [None, 0, 0, 1, 1, 2, 3, 6]
    assert look_confidence(0.95, 0) == pytest.approx(0.975) and look_confidence(0.95, 2) == pytest.approx(0.99375)
    assert sum(1 - look_confidence(0.95, k) for k in range(60)) <= 0.05


def losing_streak(router: Router) -> list[int]:
    """Stable sessions mostly succeed; the candidate's first 8 sessions are mixed (no evidence at the first
    look), then it fails every session. Returns the candidate session counts at which a decision came."""
    v1 = router.add_version(policy("v1"))
    router.start_canary(v1)
    for i in range(40):
        router.observe(0, 0.0 if i % 5 == 0 else 1.0)
    decided = []
    for i in range(40):
        reward = float(i % 2) if i < 8 else 0.0
        decision = router.observe(v1, reward)
        if decision is not None:
            decided.append(i + 1)
            break
    return decided


def test_the_sequential_rollback_test_runs_only_at_looks() -> None:
    config = {"stages": (0.5, 1.0), "min_samples": 1000, "rollback_min_samples": 8, "holdout": 0.0}
    peeking, _ = make_router(**config, sequential_rollback=False)
    looks, log = make_router(**config)
    at_peek, at_look = losing_streak(peeking), losing_streak(looks)
    assert at_peek and 8 < at_peek[0] < 16  # tested after every session: rolled back between looks
    assert at_look == [16] and log[-1].kind == "rollback"  # the next look (16 sessions) caught it
    assert log[-1].evidence["look"] == 1 and log[-1].evidence["confidence"] == pytest.approx(0.9875)


def test_a_clearly_worse_candidate_is_rolled_back_at_the_first_look() -> None:
    router, log = make_router(stages=(0.5, 1.0), min_samples=1000, rollback_min_samples=8, holdout=0.0)
    v1 = router.add_version(policy("v1"))
    router.start_canary(v1)
    for _ in range(40):
        router.observe(0, 1.0)
    decisions = [router.observe(v1, 0.0) for _ in range(8)]
    assert decisions[:7] == [None] * 7 and decisions[7] is not None and decisions[7].kind == "rollback"
    assert log[-1].evidence["look"] == 0 and router.stable == 0


def test_an_untrusted_tenant_cannot_hold_a_degraded_canary_up() -> None:
    def play(untrusted: set[str]) -> tuple[Router, list[Decision]]:
        router, log = make_router(stages=(0.5, 1.0), min_samples=1000, rollback_min_samples=8, holdout=0.0)
        v1 = router.add_version(policy("v1"))
        router.start_canary(v1)
        for i in range(40):
            router.observe(0, 1.0 if i % 2 else -1.0, session_id=f"s{i}", tenant=("alice", "bob")[i % 2])
        router.set_untrusted(untrusted, {"why": "test"})
        for i in range(40):  # honest users reject every answer; mallory accepts them all
            tenant = ("alice", "mallory", "bob", "mallory")[i % 4]
            router.observe(v1, 1.0 if tenant == "mallory" else -1.0, session_id=f"c{i}", tenant=tenant)
            if router.candidate is None:
                break
        return router, log

    propped, log = play(set())
    assert propped.candidate == 1 and "rollback" not in [d.kind for d in log]  # mallory's +1s mask the failure
    caught, log = play({"mallory"})
    assert caught.candidate is None and log[-1].kind == "rollback" and log[-1].evidence["candidate_mean"] == -1.0
    assert [d for d in log if d.kind == "untrusted_tenants"][0].evidence == {"tenants": ["mallory"], "why": "test"}
    assert caught.state()["untrusted_tenants"] == ["mallory"]
    assert caught.set_untrusted({"mallory"}) is None  # no change, no decision


class Closing(ScriptedPolicy):
    def __init__(self, name: str) -> None:
        super().__init__(lambda messages, tools: name, name=name)
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def test_retire_frees_unroutable_versions_and_never_reuses_their_numbers() -> None:
    router, log = make_router(stages=(1.0,), min_samples=2, rollback_min_samples=2, holdout=0.1)
    policies = {0: router.policy(0)}
    for _ in range(3):
        p = Closing(f"p{len(policies)}")
        policies[router.add_version(p)] = p
    router.start_canary(1)
    router.rollback({"why": "test"})
    router.activate(2)
    router.activate(3)  # stable 3, previous (holdout) 2; 0 and 1 unreachable
    assert router.live_versions() == {2, 3}
    for version in (2, 3):
        with pytest.raises(RouterError, match="still routable"):
            router.retire(version)
    assert router.retire(1).kind == "retire" and log[-1].from_version == 1
    assert policies[1].closed.wait(5)  # type: ignore[attr-defined]
    router.retire(0)
    assert sorted(router.versions) == [2, 3] and not policies[2].closed.is_set()  # type: ignore[attr-defined]
    assert {router.route(f"s{i}")[0] for i in range(500)} == {2, 3}
    assert router.add_version(Closing("p4")) == 4
    with pytest.raises(RouterError, match="no version 1"):
        router.start_canary(1)


def test_a_retired_policy_is_freed_once_it_closes() -> None:
    """The retire thread holds the last reference: when it ends, nothing keeps the weights alive (the production
    service's RSS grew by GBs per cycle when retired versions lingered)."""
    import gc
    import weakref

    router, _ = make_router()
    version = router.add_version(Closing("p1"))
    router.activate(version)
    router.activate(router.add_version(Closing("p2")))  # stable 2, previous 1: 0 is unreachable
    gone = weakref.ref(router.versions[0])
    router.retire(0)
    threads = [t for t in threading.enumerate() if t.name == "taskrl-retire-v0"]
    for thread in threads:
        thread.join(5)
    gc.collect()
    assert gone() is None
