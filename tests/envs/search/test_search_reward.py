"""Golden values for every term of the Context-1 reward (docs/design/index.md §6), the clamp, the floor and the streak
rule,
measured by the search env's reward (the ``context1`` preset built from ``RewardConfig``) and scored by its rubric
through ``taskrl.scoring.score``: the numbers the env's own formula used to give, from the one formula now."""

from __future__ import annotations

import math

import pytest
from context1_episodes import episode, rescore
from hypothesis import given
from hypothesis import strategies as st

from taskrl.envs.search.env import context1_reward
from taskrl.envs.search.reward import GroundTruth, RewardConfig, episode_metrics
from taskrl.rewards.formulas import fact_recall, output_precision, turn_penalty
from taskrl.rewards.presets import PrunePenalty, TurnPenalty
from taskrl.scoring import CLAMP, Clock, context1_clamp, score
from taskrl.types import Message, Task, ToolCall, Trajectory

# Two facts: the first is supported by a chunk repeated in two documents, the second by one chunk.
INFO = {"facts": [{"chunk_ids": ["a#0", "b#2"]}, {"chunk_ids": ["c#1"]}], "answer_chunk_ids": ["c#1"]}
TASK = Task("t", "question", info=INFO)
TRUTH = GroundTruth.from_info(INFO)
BETA_4, BETA_2 = 0, 4  # epochs of the default schedule (4 -> 2 over 4 epochs)


def scored(epoch: int = BETA_4, config: RewardConfig | None = None, **kw: object) -> tuple[Trajectory, dict]:
    """The episode scored as the env scores it, and its ``search/*`` metrics."""
    traj, record = episode(**kw)  # type: ignore[arg-type]
    config = config or RewardConfig()
    out = rescore(traj, TASK, config, epoch)
    return out, episode_metrics(record, TRUTH, out.terms, config=config)


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
    traj, _ = episode(tool_calls=tuple(calls))
    assert PrunePenalty()(traj, TASK) == pytest.approx(-expected)


def test_prune_calls_that_never_ran_do_not_count() -> None:
    calls = [ToolCall(f"c{i}", "prune_chunks", {}) for i in range(5)]
    results = [Message("tool", "Invalid tool call: bad JSON", tool_call_id="c4", is_error=True)]
    traj = Trajectory(messages=[Message("assistant", "", calls), *results])
    assert PrunePenalty()(traj, TASK) == pytest.approx(-0.1)  # 4 ran: one past the free streak


@pytest.mark.parametrize(
    ("turns", "expected"), [(0, 0.0), (64, 0.0), (65, 0.5 / 64), (96, 0.25), (128, 0.5), (500, 0.5)]
)
def test_turn_penalty_is_linear_from_64_to_128(turns: int, expected: float) -> None:
    assert turn_penalty(turns) == pytest.approx(expected)
    traj, _ = episode(turns=turns)
    assert TurnPenalty()(traj, TASK) == pytest.approx(-expected)


def _clamped(gain: float, penalty: float, *, completed: bool) -> float:
    """The env rubric's total for an episode measured with ``gain`` found and ``penalty`` of prune penalty."""
    info = {"final_answer": "DOCUMENTS: a"} if completed else {}
    traj = Trajectory(terms={"answer_found": gain, "prune_penalty": -penalty}, info=info, terminated=completed)
    score([traj], context1_reward(RewardConfig()), Clock())
    return traj.reward


def test_clamp_floor_and_cap() -> None:
    assert _clamped(1.0, 0.2, completed=True) == pytest.approx(0.8)
    assert _clamped(1.0, 1.3, completed=True) == pytest.approx(0.01)  # penalties cannot push below ε
    assert _clamped(0.0, 0.5, completed=True) == pytest.approx(0.01)  # the floor wins when r_pre < ε
    assert _clamped(0.2, 0.7, completed=False) == 0.0  # failures floor at 0
    assert _clamped(0.2, 0.1, completed=False) == pytest.approx(0.1)
    assert context1_clamp(1.5, 1.0, epsilon=0.01, completed=True) == 1.0  # never above the pre-penalty value


def test_golden_full_episode() -> None:
    # Listed a, c, x: recall 1 (both facts), precision 2/3; β = 4: F = 17·(2/3)·1 / (16·(2/3) + 1) = 34/35.
    # Encountered a#0 only: r_traj 0.5; answer chunk c#1 not encountered: r_fa 0. Prune streak of 5: 0.2.
    # 70 turns: p_turn 0.5·6/64. r = 0.7·34/35 + 0.3·0.5 - 0.2 - 0.046875.
    out, metrics = scored(
        output_docs=("a", "c", "x"),
        encountered=("a#0", "q#1"),
        pruned=("q#1",),
        tool_calls=("search_corpus",) + ("prune_chunks",) * 5,
        turns=70,
    )
    assert out.terms["f_beta"] == pytest.approx(34 / 35)  # measured: unweighted
    assert out.rewards["f_beta"] == pytest.approx(0.7 * 34 / 35)
    assert out.rewards["trajectory_recall"] == pytest.approx(0.15)
    assert out.rewards["answer_found"] == 0.0
    assert out.rewards["prune_penalty"] == pytest.approx(-0.2)
    assert out.rewards["turn_penalty"] == pytest.approx(-0.046875)
    assert out.rewards[CLAMP] == 0.0
    assert out.reward == pytest.approx(0.7 * 34 / 35 + 0.15 - 0.2 - 0.046875)
    assert metrics["search/output_recall"] == 1.0
    assert metrics["search/output_precision"] == pytest.approx(2 / 3)
    assert out.terms["f_beta"] == pytest.approx(34 / 35)
    assert metrics["search/prune_accuracy"] == 1.0  # q#1 was irrelevant
    assert metrics["search/tool_calls_per_turn"] == pytest.approx(6 / 70)


def test_golden_perfect_episode_and_beta_two() -> None:
    out, _ = scored(BETA_2, output_docs=("a", "c"), encountered=("a#0", "c#1"), tool_calls=("search_corpus",))
    assert out.rewards == {
        "f_beta": pytest.approx(0.7),
        "trajectory_recall": pytest.approx(0.3),
        "answer_found": 1.0,
        "prune_penalty": 0.0,
        "turn_penalty": 0.0,
        "clamp": 0.0,
    }
    assert out.reward == pytest.approx(2.0)


def test_beta_changes_the_recall_precision_trade() -> None:
    # Recall 0.5, precision 1: F_4 = 17·0.5/(16+0.5) = 17/33, F_2 = 5·0.5/(4+0.5) = 5/9.
    assert scored(BETA_4, output_docs=("c",))[0].terms["f_beta"] == pytest.approx(17 / 33)
    assert scored(BETA_2, output_docs=("c",))[0].terms["f_beta"] == pytest.approx(5 / 9)
    assert scored(BETA_2, output_docs=("c",))[0].rewards["f_beta"] == pytest.approx(0.7 * 5 / 9)


def test_pruned_chunks_keep_their_credit_and_bad_prunes_lower_prune_accuracy() -> None:
    kept, kept_metrics = scored(encountered=("c#1",))
    pruned, pruned_metrics = scored(encountered=("c#1",), pruned=("c#1",))
    assert pruned.rewards["trajectory_recall"] == kept.rewards["trajectory_recall"] == pytest.approx(0.15)
    assert pruned.rewards["answer_found"] == kept.rewards["answer_found"] == 1.0
    assert pruned_metrics["search/prune_accuracy"] == 0.0
    assert math.isnan(kept_metrics["search/prune_accuracy"])


def test_never_searching_scores_the_floor_and_failures_zero() -> None:
    assert scored()[0].reward == pytest.approx(0.01)
    assert scored(completed=False)[0].reward == 0.0
    heavy, _ = scored(tool_calls=("prune_chunks",) * 9, turns=200, encountered=("a#0",))
    assert heavy.reward == pytest.approx(0.01)  # 0.15 - 0.5 - 0.5, floored


@given(
    found=st.sets(st.sampled_from(["a#0", "b#2", "c#1", "x#0"])),
    docs=st.lists(st.sampled_from(["a", "b", "c", "x", "y"]), max_size=5, unique=True),
    prunes=st.integers(0, 12),
    turns=st.integers(1, 200),
    completed=st.booleans(),
    beta=st.floats(1.0, 4.0),
)
def test_reward_is_within_floor_and_pre_penalty_value(
    found: set[str], docs: list[str], prunes: int, turns: int, completed: bool, beta: float
) -> None:
    config = RewardConfig(beta_start=beta)
    out, _ = scored(config=config, output_docs=tuple(docs), encountered=tuple(sorted(found)),
                    tool_calls=("prune_chunks",) * prunes, turns=turns, completed=completed)  # fmt: skip
    pre = out.rewards["f_beta"] + out.rewards["trajectory_recall"] + out.rewards["answer_found"]
    lower = 0.01 if completed else 0.0
    assert lower - 1e-12 <= out.reward <= max(pre, lower) + 1e-12
    expected_prune = min(0.1 * (prunes - 3), 0.5) if prunes > 3 else 0.0
    raw = pre - expected_prune - turn_penalty(turns)
    assert out.reward == pytest.approx(context1_clamp(raw, pre, completed=completed, epsilon=0.01))
    recall = fact_recall(TRUTH.facts, found_docs=docs)
    precision = output_precision(docs, TRUTH.relevant_docs)
    f = (1 + beta**2) * precision * recall / (beta**2 * precision + recall) if precision + recall else 0.0
    assert out.terms["f_beta"] == pytest.approx(f)  # β at the start of the schedule is beta_start


def test_beta_anneals_over_epochs() -> None:
    rubric = context1_reward(RewardConfig(beta_anneal_epochs=4))
    assert rubric.params(Clock())["f_beta"] == 4.0
    assert rubric.params(Clock(100, epoch=2))["f_beta"] == pytest.approx(3.0)
    assert rubric.params(Clock(900, epoch=9))["f_beta"] == 2.0


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
