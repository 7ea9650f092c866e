"""Reward map golden values, and store -> trajectories: exact tokens, staleness window, feedback filter, groups."""

from __future__ import annotations

import pytest

from taskrl.deploy.dataset import trajectories_from_store
from taskrl.deploy.feedback import RewardMap
from taskrl.deploy.store import Feedback, Interaction, InteractionStore


def test_reward_map_golden_values() -> None:
    rewards = RewardMap()

    def one(kind: str, value: float | None = None) -> float | None:
        return rewards.signal_reward(Feedback("i", "t", kind, value))

    assert (one("accepted"), one("rejected"), one("dissatisfied_followup")) == (1.0, -1.0, -0.5)
    assert (one("rating", 1), one("rating", 3), one("rating", 5)) == (-1.0, 0.0, 1.0)
    assert (one("edit_kept", 30), one("edit_kept", 2)) == (1.0, None)  # kept only after 10 minutes
    assert rewards.reward([Feedback("i", "t", "accepted"), Feedback("i", "t", "dissatisfied_followup")]) == 0.25
    assert rewards.reward([Feedback("i", "t", "edit_kept", 1.0)]) is None
    with pytest.raises(ValueError, match="edit_kept_min_minutes"):
        RewardMap(edit_kept_min_minutes=-1)


def row(i: int, version: int, prompt: list[int]) -> Interaction:
    return Interaction(
        tenant="t",
        session_id=f"s{i}",
        model="m",
        policy_version=version,
        request={
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ]
        },
        response={"message": {"role": "assistant", "content": f"a{i}"}, "finish_reason": "stop"},
        completion_token_ids=[100 + i, 2],
        logprobs=[-0.1 * i, -0.5],
        prompt_token_ids=prompt,
        id=f"int_{i}",
    )


def test_trajectories_from_store(store_url: str) -> None:
    with InteractionStore(store_url) as store:
        versions = [0, 1, 2, 2, 2]
        for i, version in enumerate(versions):
            store.add_sync("interactions", row(i, version, [1, 2, 3] if i != 4 else [1, 9]))
        store.add_sync("interactions", Interaction(**{**row(5, 2, [1]).__dict__, "id": "int_5", "shadow": True}))
        for i in (0, 1, 2, 4, 5):
            store.add_sync("feedback", Feedback(f"int_{i}", "t", "accepted" if i != 4 else "rejected"))
        trajectories, stats = trajectories_from_store(store, max_staleness=1)
    assert [t.id for t in trajectories] == ["int_1", "int_2", "int_4"]  # v0 stale, int_3 no feedback, 5 shadow
    assert (stats.latest_version, stats.min_version, stats.without_feedback, stats.used) == (2, 1, 1, 3)
    first = trajectories[1]
    segment = first.segments[0]
    assert segment.token_ids == [1, 2, 3, 102, 2] and segment.loss_mask == [0, 0, 0, 1, 1]
    assert segment.logprobs == [0.0, 0.0, 0.0, pytest.approx(-0.2), -0.5] and segment.policy_version == 2
    assert [t.reward for t in trajectories] == [1.0, 1.0, -1.0]
    assert trajectories[0].group_id == trajectories[1].group_id != trajectories[2].group_id
    assert first.messages[-1].content == "a2" and first.terminated
    assert first.messages[1].tool_calls[0].name == "f" and first.messages[2].tool_call_id == "c1"
