"""Training data from production: logged interactions with feedback -> token-exact ``Trajectory`` objects.

``trajectories_from_store(store, reward_map, max_staleness=...)`` keeps only interactions served by the last
``max_staleness`` policy versions that have feedback which counts, and turns each into a one-segment
trajectory: the stored prompt ids (mask 0) + the stored completion ids (mask 1) with the stored logprobs
and policy version, never a re-tokenisation. Groups (for GRPO's baselines) are identical prompts by default.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from taskrl.deploy.feedback import RewardMap
from taskrl.deploy.schemas import ChatMessageIn
from taskrl.deploy.store import Interaction, InteractionStore
from taskrl.types import Message, Segment, Trajectory

GroupBy = Literal["prompt", "session", "none"]


@dataclass
class StoreDataStats:
    """Why interactions were or were not turned into trajectories (log these with every training cycle)."""

    latest_version: int | None = None
    min_version: int | None = None
    read: int = 0
    without_feedback: int = 0
    without_tokens: int = 0
    used: int = 0
    by_version: dict[int, int] = field(default_factory=dict)


def _prompt_key(ids: list[int]) -> str:
    return hashlib.blake2b(",".join(map(str, ids)).encode(), digest_size=8).hexdigest()


def interaction_trajectory(row: Interaction, reward: float, group_id: str | None) -> Trajectory:
    """One interaction as a trajectory with a single token-exact segment."""
    prompt = list(row.prompt_token_ids or [])
    completion = list(row.completion_token_ids)
    segment = Segment(
        token_ids=prompt + completion,
        logprobs=[0.0] * len(prompt) + [float(x) for x in row.logprobs],
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        policy_version=row.policy_version,
    )
    # The request was validated by the server's schema when it was served, so it parses back the same way.
    messages = [ChatMessageIn.model_validate(m).to_message() for m in row.request.get("messages", [])]
    answer = row.response.get("message", {})
    messages.append(Message("assistant", answer.get("content") or ""))
    return Trajectory(
        id=row.id,
        task_id=_prompt_key(prompt),
        env=f"deploy:{row.model}",
        group_id=group_id,
        segments=[segment],
        messages=messages,
        rewards={"feedback": reward},
        terminated=True,
        info={"interaction_id": row.id, "session_id": row.session_id, "final_answer": answer.get("content")},
    )


def trajectories_from_store(
    store: InteractionStore,
    reward_map: RewardMap | None = None,
    *,
    max_staleness: int = 1,
    model: str | None = None,
    latest_version: int | None = None,
    group_by: GroupBy = "prompt",
) -> tuple[list[Trajectory], StoreDataStats]:
    """Trajectories from interactions of versions ``latest - max_staleness .. latest`` that have feedback.

    ``latest_version`` defaults to the newest version in the store; shadow runs are never used (no user saw
    them, so their feedback cannot exist). Interactions whose backend reported no token ids are skipped.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    reward_map = reward_map or RewardMap()
    stats = StoreDataStats(latest_version=latest_version if latest_version is not None else store.max_version(model))
    if stats.latest_version is None:
        return [], stats
    stats.min_version = stats.latest_version - max_staleness
    rows = [
        r
        for r in store.interactions(min_version=stats.min_version, model=model, include_shadow=False)
        if r.policy_version <= stats.latest_version
    ]
    stats.read = len(rows)
    feedback = defaultdict(list)
    for item in store.feedback(interaction_ids=[r.id for r in rows]) if rows else []:
        feedback[item.interaction_id].append(item)
    trajectories = []
    for row in rows:
        reward = reward_map.reward(feedback.get(row.id, []))
        if reward is None:
            stats.without_feedback += 1
            continue
        if (
            not row.prompt_token_ids
            or not row.completion_token_ids
            or len(row.logprobs) != len(row.completion_token_ids)
        ):
            stats.without_tokens += 1
            continue
        group = {"prompt": _prompt_key(row.prompt_token_ids), "session": row.session_id, "none": None}[group_by]
        trajectories.append(interaction_trajectory(row, reward, group))
        stats.by_version[row.policy_version] = stats.by_version.get(row.policy_version, 0) + 1
    stats.used = len(trajectories)
    return trajectories, stats
