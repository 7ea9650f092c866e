"""feedback_trust: a tenant that contradicts the others on the same answers is left out of training, on a real store."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from taskrl.deploy.dataset import trajectories_from_store
from taskrl.deploy.feedback_trust import TrustedFeedbackStore, reply_text, tenant_agreement
from taskrl.deploy.store import Feedback, Interaction, InteractionStore


def _row(tenant: str, prompt: int, answer: str, n: int) -> Interaction:
    return Interaction(
        tenant=tenant,
        session_id=f"{tenant}-{n}",
        model="m",
        policy_version=0,
        request={"messages": [{"role": "user", "content": f"q{prompt}"}]},
        response={"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"},
        completion_token_ids=[7, 8],
        logprobs=[-0.5, -0.5],
        prompt_token_ids=[1, 2, prompt],
    )


def _traffic(adversary_flips: bool, seed: int = 0) -> tuple[list[Interaction], list[Feedback]]:
    """Four tenants ask the same 6 prompts; answer "right" is correct. Honest tenants flip 10% of their signals;
    ``mallory`` inverts every signal when ``adversary_flips``."""
    rng = random.Random(seed)
    rows, signals = [], []
    for n in range(240):
        tenant = ("alice", "bob", "carol", "mallory")[n % 4]
        answer = rng.choice(["right", "wrong"])
        row = _row(tenant, rng.randrange(6), answer, n)
        liked = answer == "right"
        if (tenant == "mallory" and adversary_flips) or rng.random() < 0.1:
            liked = not liked
        rows.append(row)
        signals.append(Feedback(row.id, tenant, "accepted" if liked else "rejected"))
    return rows, signals


def _filled(store: InteractionStore, rows: list[Interaction], signals: list[Feedback]) -> InteractionStore:
    for row in rows:
        store.add_sync("interactions", row)
    for signal in signals:
        store.add_sync("feedback", signal)
    return store


def test_agreement_separates_an_inverting_tenant_from_noisy_honest_ones() -> None:
    rows, signals = _traffic(adversary_flips=True)
    found = tenant_agreement(rows, signals)
    assert found["mallory"].comparisons >= 50
    assert found["mallory"].rate is not None and found["mallory"].rate < 0.3
    for honest in ("alice", "bob", "carol"):
        assert found[honest].rate is not None and found[honest].rate > 0.6, (honest, found[honest])


def test_no_tenant_is_flagged_when_all_are_honest() -> None:
    rows, signals = _traffic(adversary_flips=False)
    assert all((a.rate or 0) > 0.6 for a in tenant_agreement(rows, signals).values())


def test_answers_compare_only_on_the_same_prompt_and_answer_key() -> None:
    a, b = _row("alice", 1, "The price is 5.", 0), _row("bob", 2, "the price is 5.", 1)
    signals = [Feedback(a.id, "alice", "accepted"), Feedback(b.id, "bob", "rejected")]
    assert tenant_agreement([a, b], signals)["alice"].comparisons == 0  # different prompts: nothing to compare
    c = _row("bob", 1, "the  PRICE is 5.", 2)  # same prompt, same normalised text
    found = tenant_agreement([a, c], [signals[0], Feedback(c.id, "bob", "rejected")], answer_key=reply_text)
    assert (found["alice"].comparisons, found["alice"].agreements) == (1, 0)


def test_trusted_store_drops_the_adversary_from_training_data(tmp_path: Path) -> None:
    rows, signals = _traffic(adversary_flips=True)
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        _filled(store, rows, signals)
        trusted = TrustedFeedbackStore(store, min_overlap=20, model="m")
        trajectories, stats = trajectories_from_store(trusted, max_staleness=0, model="m")
        assert trusted.excluded == {"mallory"}
        assert trusted.report()["tenants"]["mallory"]["rate"] < 0.3
        tenant_of = {r.id: r.tenant for r in rows}
        assert stats.used == 180 and {tenant_of[t.id] for t in trajectories} == {"alice", "bob", "carol"}
        assert trusted.decisions() == []  # everything but feedback() is the real store's
        assert len(trajectories_from_store(store, max_staleness=0, model="m")[0]) == 240
        trusted.fresh_since = rows[200].created_at  # training takes only rows newer than the last cycle's
        fresh, _ = trajectories_from_store(trusted, max_staleness=0, model="m")
        assert {t.id for t in fresh} == {r.id for r in rows[200:] if r.tenant != "mallory"}
        assert trusted.refresh() == {"mallory"}, "trust still counts the whole history"
        trusted.max_fresh = 8
        assert [r.id for r in trusted.interactions(model="m")] == [r.id for r in rows[-8:]]


def test_bad_settings_fail_naming_the_field(tmp_path: Path) -> None:
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        with pytest.raises(ValueError, match="min_agreement"):
            TrustedFeedbackStore(store, min_agreement=0)
        with pytest.raises(ValueError, match="min_overlap"):
            TrustedFeedbackStore(store, min_overlap=0)
        with pytest.raises(ValueError, match="unjudged"):
            TrustedFeedbackStore(store, unjudged="trust")  # type: ignore[arg-type]


def _early(tmp_path: Path, unjudged: str) -> tuple[TrustedFeedbackStore, list[Feedback], dict[str, str]]:
    """The first 40 signals of the adversarial traffic: nobody has 20 comparisons yet, so nobody is judged."""
    rows, signals = _traffic(adversary_flips=True)
    rows, signals = rows[:40], signals[:40]
    store = _filled(InteractionStore(f"sqlite:///{tmp_path / f'{unjudged}.db'}"), rows, signals)
    trusted = TrustedFeedbackStore(store, min_overlap=20, model="m", unjudged=unjudged)  # type: ignore[arg-type]
    return trusted, signals, {r.id: r.tenant for r in rows}


def test_unjudged_keep_trains_on_an_adversary_nobody_has_judged_yet(tmp_path: Path) -> None:
    trusted, signals, _ = _early(tmp_path, "keep")
    kept = trusted.feedback()
    assert trusted.excluded == set() and trusted.unjudged_tenants == {"alice", "bob", "carol", "mallory"}
    assert len(kept) == len(signals) and trusted.held_back == 0
    trusted.store.close()


def test_unjudged_corroborated_keeps_only_signals_another_tenant_agrees_with(tmp_path: Path) -> None:
    trusted, signals, _ = _early(tmp_path, "corroborated")
    kept = trusted.feedback()
    assert 0 < len(kept) < len(signals) and trusted.held_back == len(signals) - len(kept)
    # every kept signal has a same-sign signal from another tenant on the same (prompt, answer)
    rows = {r.id: r for r in trusted.store.interactions(model="m")}
    def unit(f: Feedback) -> tuple:
        return (tuple(rows[f.interaction_id].prompt_token_ids), reply_text(rows[f.interaction_id]), f.kind)
    for f in kept:
        assert any(g.tenant != f.tenant and unit(g) == unit(f) for g in signals), f
    # mallory inverts everything, so it is corroborated only where an honest tenant flipped: rarely
    wrong = [f for f in kept if (f.kind == "accepted") != (reply_text(rows[f.interaction_id]) == "right")]
    assert len(wrong) / len(kept) < 0.25, (len(wrong), len(kept))
    all_wrong = [f for f in signals if (f.kind == "accepted") != (reply_text(rows[f.interaction_id]) == "right")]
    assert len(all_wrong) / len(signals) > len(wrong) / len(kept), "corroboration must clean the labels"
    assert trusted.report()["unjudged_signals_held_back"] == trusted.held_back
    trusted.store.close()


def test_unjudged_drop_waits_until_tenants_are_judged(tmp_path: Path) -> None:
    trusted, _, _ = _early(tmp_path, "drop")
    assert trusted.feedback() == []  # nobody judged yet: nothing to train on
    trusted.store.close()
    rows, signals = _traffic(adversary_flips=True)
    with InteractionStore(f"sqlite:///{tmp_path / 'all.db'}") as store:
        _filled(store, rows, signals)
        full = TrustedFeedbackStore(store, min_overlap=20, model="m", unjudged="drop")
        kept = full.feedback()
        assert full.excluded == {"mallory"} and not (full.unjudged_tenants & {"alice", "bob", "carol"})
        assert {f.tenant for f in kept} == {"alice", "bob", "carol"} and len(kept) == 180


def test_an_excluded_tenant_corroborates_nobody(tmp_path: Path) -> None:
    from taskrl.deploy.feedback_trust import answer_votes, corroborated_signals

    a, m = _row("alice", 1, "right", 0), _row("mallory", 1, "right", 1)
    signals = [Feedback(a.id, "alice", "accepted"), Feedback(m.id, "mallory", "accepted")]
    votes = answer_votes([a, m], signals)
    assert corroborated_signals(votes) == {s.id for s in signals}
    assert corroborated_signals(votes, ignore={"mallory"}) == {signals[1].id}  # alice's stands alone now


def test_the_cycle_keeps_an_excluded_tenant_out_of_the_canary_evidence(tmp_path: Path) -> None:
    import asyncio

    from taskrl.deploy.cycle import CycleConfig, ProductionCycle
    from taskrl.deploy.router import Router, RouterConfig
    from taskrl.policies.scripted import ScriptedPolicy

    rows, signals = _traffic(adversary_flips=True)
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        _filled(store, rows, signals)
        trusted = TrustedFeedbackStore(store, min_overlap=20, model="m")
        router = Router("m", ScriptedPolicy(lambda m, t: "x", name="v0"), RouterConfig())
        cycle = ProductionCycle(None, None, router, trusted, CycleConfig(), {"s": lambda p: None})  # type: ignore[arg-type]
        decision = asyncio.run(cycle.refresh_trust())
        assert decision is not None and decision.kind == "untrusted_tenants"
        assert router.untrusted == {"mallory"} and decision.evidence["tenants"] == ["mallory"]
        assert decision.evidence["trust"]["tenants"]["mallory"]["rate"] < 0.3
        assert asyncio.run(cycle.refresh_trust()) is None  # unchanged trust: no new decision
        plain = ProductionCycle(None, None, router, store, CycleConfig(), {"s": lambda p: None})  # type: ignore[arg-type]
        assert asyncio.run(plain.refresh_trust()) is None  # a plain store has no trust to apply
