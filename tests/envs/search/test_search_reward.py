"""Golden values for every term of the Context-1 reward (DESIGN.md §6), the clamp, the floor and the streak rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskrl.envs.search.reward import (
    EpisodeRecord,
    GroundTruth,
    RewardConfig,
    SearchReward,
    clamp_reward,
    fact_recall,
    output_precision,
    prune_penalty,
    score_episode,
    turn_penalty,
)

# Two facts: the first is supported by a chunk repeated in two documents, the second by one chunk.
TRUTH = GroundTruth(facts=(("a#0", "b#2"), ("c#1",)), answer_chunk_ids=frozenset({"c#1"}))


def record(**kw: object) -> EpisodeRecord:
    base = dict(output_docs=(), encountered=frozenset(), pruned=frozenset(), tool_calls=(), turns=2, completed=True)
    return EpisodeRecord(**{**base, **kw})  # type: ignore[arg-type]


def test_fact_recall_counts_a_fact_once_whichever_of_its_chunks_is_found() -> None:
    assert fact_recall(TRUTH.facts, found_chunks={"b#2"}) == 0.5
    assert fact_recall(TRUTH.facts, found_chunks={"a#0", "b#2"}) == 0.5
    assert fact_recall(TRUTH.facts, found_chunks={"a#0", "c#1", "zz#9"}) == 1.0
    assert fact_recall(TRUTH.facts, found_docs={"b"}) == 0.5
    assert fact_recall(TRUTH.facts, found_docs={"c", "a"}) == 1.0
    assert fact_recall(TRUTH.facts, found_docs={"c#1"}) == 0.0  # documents are ids without '#'
    assert fact_recall(TRUTH.facts) == 0.0


def test_output_precision() -> None:
    assert output_precision(["a", "c", "x", "y"], TRUTH.relevant_docs) == 0.5
    assert output_precision([], TRUTH.relevant_docs) == 0.0
    assert TRUTH.relevant_docs == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ([], 0.0),
        (["prune_chunks"] * 3, 0.0),
        (["prune_chunks"] * 4, 0.1),
        (["prune_chunks"] * 6, 0.3),
        (["prune_chunks"] * 3 + ["search_corpus"] + ["prune_chunks"] * 3, 0.0),  # another tool resets the streak
        (["prune_chunks"] * 5 + ["grep_corpus"] + ["prune_chunks"] * 5, 0.4),
        (["prune_chunks"] * 20, 0.5),  # capped
    ],
)
def test_prune_penalty_streak_rule(calls: list[str], expected: float) -> None:
    assert prune_penalty(calls) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("turns", "expected"), [(0, 0.0), (64, 0.0), (65, 0.5 / 64), (96, 0.25), (128, 0.5), (500, 0.5)]
)
def test_turn_penalty_is_linear_from_64_to_128(turns: int, expected: float) -> None:
    assert turn_penalty(turns) == pytest.approx(expected)


def test_clamp_floor_and_cap() -> None:
    assert clamp_reward(0.8, 1.0, completed=True, floor=0.01) == 0.8
    assert clamp_reward(-0.3, 1.0, completed=True, floor=0.01) == 0.01  # penalties cannot push below ε
    assert clamp_reward(1.5, 1.0, completed=True, floor=0.01) == 1.0  # never above the pre-penalty value
    assert clamp_reward(-0.5, 0.0, completed=True, floor=0.01) == 0.01  # the floor wins when r_pre < ε
    assert clamp_reward(-0.5, 0.2, completed=False, floor=0.01) == 0.0  # failures floor at 0
    assert clamp_reward(0.1, 0.2, completed=False, floor=0.01) == 0.1


def test_golden_full_episode() -> None:
    # Listed a, c, x: recall 1 (both facts), precision 2/3; β = 4: F = 17·(2/3)·1 / (16·(2/3) + 1) = 34/35.
    # Encountered a#0 only: r_traj 0.5; answer chunk c#1 not encountered: r_fa 0. Prune streak of 5: 0.2.
    # 70 turns: p_turn 0.5·6/64. r = 0.7·34/35 + 0.3·0.5 - 0.2 - 0.046875.
    rec = record(
        output_docs=("a", "c", "x"),
        encountered=frozenset({"a#0", "q#1"}),
        pruned=frozenset({"q#1"}),
        tool_calls=("search_corpus",) + ("prune_chunks",) * 5,
        turns=70,
    )
    out = score_episode(rec, TRUTH, beta=4.0)
    assert out.terms["f_beta"] == pytest.approx(0.7 * 34 / 35)
    assert out.terms["trajectory_recall"] == pytest.approx(0.15)
    assert out.terms["answer_found"] == 0.0
    assert out.terms["prune_penalty"] == pytest.approx(-0.2)
    assert out.terms["turn_penalty"] == pytest.approx(-0.046875)
    assert out.terms["clamp"] == 0.0
    assert out.total == pytest.approx(0.7 * 34 / 35 + 0.15 - 0.2 - 0.046875)
    assert out.metrics["search/output_recall"] == 1.0
    assert out.metrics["search/output_precision"] == pytest.approx(2 / 3)
    assert out.metrics["search/f_beta"] == pytest.approx(34 / 35)
    assert out.metrics["search/prune_accuracy"] == 1.0  # q#1 was irrelevant
    assert out.metrics["search/tool_calls_per_turn"] == pytest.approx(6 / 70)


def test_golden_perfect_episode_and_beta_two() -> None:
    rec = record(output_docs=("a", "c"), encountered=frozenset({"a#0", "c#1"}), tool_calls=("search_corpus",))
    out = score_episode(rec, TRUTH, beta=2.0)
    assert out.terms == {
        "f_beta": pytest.approx(0.7),
        "trajectory_recall": pytest.approx(0.3),
        "answer_found": 1.0,
        "prune_penalty": 0.0,
        "turn_penalty": 0.0,
        "clamp": 0.0,
    }
    assert out.total == pytest.approx(2.0)


def test_beta_changes_the_recall_precision_trade() -> None:
    # Recall 0.5, precision 1: F_4 = 17·0.5/(16+0.5) = 17/33, F_2 = 5·0.5/(4+0.5) = 5/9.
    rec = record(output_docs=("c",))
    assert score_episode(rec, TRUTH, beta=4.0).metrics["search/f_beta"] == pytest.approx(17 / 33)
    assert score_episode(rec, TRUTH, beta=2.0).metrics["search/f_beta"] == pytest.approx(5 / 9)


def test_pruned_chunks_keep_their_credit_and_bad_prunes_lower_prune_accuracy() -> None:
    kept = score_episode(record(encountered=frozenset({"c#1"})), TRUTH, beta=4.0)
    pruned = score_episode(record(encountered=frozenset({"c#1"}), pruned=frozenset({"c#1"})), TRUTH, beta=4.0)
    assert pruned.terms["trajectory_recall"] == kept.terms["trajectory_recall"] == pytest.approx(0.15)
    assert pruned.terms["answer_found"] == kept.terms["answer_found"] == 1.0
    assert pruned.metrics["search/prune_accuracy"] == 0.0
    assert math.isnan(kept.metrics["search/prune_accuracy"])


def test_never_searching_scores_the_floor_and_failures_zero() -> None:
    assert score_episode(record(), TRUTH, beta=4.0).total == pytest.approx(0.01)
    assert score_episode(record(completed=False), TRUTH, beta=4.0).total == 0.0
    heavy = record(tool_calls=("prune_chunks",) * 9, turns=200, encountered=frozenset({"a#0"}))
    assert score_episode(heavy, TRUTH, beta=4.0).total == pytest.approx(0.01)  # 0.15 - 0.5 - 0.5, floored


@given(
    found=st.sets(st.sampled_from(["a#0", "b#2", "c#1", "x#0"])),
    docs=st.lists(st.sampled_from(["a", "b", "c", "x", "y"]), max_size=5),
    prunes=st.integers(0, 12),
    turns=st.integers(1, 200),
    completed=st.booleans(),
    beta=st.floats(1.0, 4.0),
)
def test_reward_is_within_floor_and_pre_penalty_value(
    found: set[str], docs: list[str], prunes: int, turns: int, completed: bool, beta: float
) -> None:
    rec = record(output_docs=tuple(docs), encountered=frozenset(found), tool_calls=("prune_chunks",) * prunes,
                 turns=turns, completed=completed)  # fmt: skip
    out = score_episode(rec, TRUTH, beta=beta)
    pre = out.terms["f_beta"] + out.terms["trajectory_recall"] + out.terms["answer_found"]
    lower = 0.01 if completed else 0.0
    assert lower - 1e-12 <= out.total <= max(pre, lower) + 1e-12
    expected_prune = min(0.1 * (prunes - 3), 0.5) if prunes > 3 else 0.0
    raw = pre - expected_prune - turn_penalty(turns)
    assert out.total == pytest.approx(clamp_reward(raw, pre, completed=completed, floor=0.01))


def test_beta_anneals_over_epochs() -> None:
    reward = SearchReward(RewardConfig(beta_anneal_epochs=4))
    assert reward.beta == 4.0
    reward.set_step(100, epoch=2)
    assert reward.beta == pytest.approx(3.0)
    reward.set_step(900, epoch=9)
    assert reward.beta == 2.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"floor": -0.1}, "RewardConfig.floor"),
        ({"prune_free_streak": -1}, "RewardConfig.prune_free_streak"),
        ({"turn_penalty_start": 128, "turn_penalty_end": 64}, "RewardConfig.turn_penalty_start"),
        ({"beta_end": 0}, "RewardConfig.beta_end"),
        ({"beta_anneal_epochs": 0}, "RewardConfig.beta_anneal_epochs"),
    ],
)
def test_bad_reward_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RewardConfig(**kwargs)


def test_ground_truth_needs_facts() -> None:
    with pytest.raises(ValueError, match="at least one fact"):
        GroundTruth(facts=(), answer_chunk_ids=frozenset())
    truth = GroundTruth.from_info({"facts": [{"chunk_ids": ["a#0"]}], "answer_chunk_ids": ["a#0"]})
    assert truth.facts == (("a#0",),) and truth.relevant_chunks == {"a#0"}
