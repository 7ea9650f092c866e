"""Training data from production: logged interactions with feedback -> token-exact ``Trajectory`` objects.

``trajectories_from_store(store, reward_map, max_staleness=...)`` keeps only interactions served by the last
``max_staleness`` policy versions that have feedback which counts, and turns each into a one-segment
trajectory: the stored prompt ids (mask 0) + the stored completion ids (mask 1) with the stored logprobs
and policy version, never a re-tokenisation. Groups (for GRPO's baselines) are identical prompts by default.
Each segment carries the temperature its row was sampled at, so the learner scores it at its own distribution.
Stored rows are treated as hostile: a row with non-finite or positive logprobs, token ids that are not
non-negative ints, mismatched lengths or a request that no longer parses is skipped and counted
(``StoreDataStats.malformed``/``non_finite``), as are rows whose response never reached the client.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal

from taskrl.deploy.feedback import RewardMap
from taskrl.deploy.schemas import ChatMessageIn
from taskrl.deploy.store import Interaction, InteractionStore
from taskrl.types import Message, Segment, Trajectory

GroupBy = Literal["prompt", "session", "none"]
logger = logging.getLogger(__name__)


@dataclass
class StoreDataStats:
    """Why interactions were or were not turned into trajectories (log these with every training cycle)."""

    latest_version: int | None = None
    min_version: int | None = None
    read: int = 0
    without_feedback: int = 0
    without_tokens: int = 0
    non_finite: int = 0
    """Rows whose logprobs are NaN/inf (a poisoned sampler): never trained on."""
    malformed: int = 0
    """Rows that fail any other check (ids, lengths, logprobs > 0, request, sampling)."""
    undelivered: int = 0
    rolled_back: int = 0
    """Rows served by an ``exclude_versions`` version (e.g. a canary rolled back): never trained on."""
    used: int = 0
    by_version: dict[int, int] = field(default_factory=dict)


def _prompt_key(ids: list[int]) -> str:
    return hashlib.blake2b(",".join(map(str, ids)).encode(), digest_size=8).hexdigest()


class MalformedRow(ValueError):
    """A stored interaction that cannot be trained on as it is."""


def _ids(values: object, name: str) -> list[int]:
    if not isinstance(values, list) or not all(type(t) is int and t >= 0 for t in values):
        raise MalformedRow(f"{name} must be a list of non-negative ints")
    return list(values)


def row_temperature(row: Interaction) -> float | None:
    """Temperature whose distribution the row's logprobs are of: the stored sampling's (greedy rows report the
    temperature-1 distribution), else the request's, else None (the trainer's own)."""
    sampling = row.sampling or {}
    value = sampling.get("temperature", row.request.get("temperature") if isinstance(row.request, dict) else None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise MalformedRow(f"stored temperature {value!r} is not a finite number >= 0")
    return float(value) if value > 0 else 1.0


def interaction_trajectory(row: Interaction, reward: float, group_id: str | None) -> Trajectory:
    """One interaction as a trajectory with a single token-exact segment (``MalformedRow`` if it cannot be one)."""
    prompt = _ids(row.prompt_token_ids or [], "prompt_token_ids")
    completion = _ids(row.completion_token_ids, "completion_token_ids")
    logprobs = row.logprobs if isinstance(row.logprobs, list) else []
    if len(logprobs) != len(completion):
        raise MalformedRow(f"{len(logprobs)} logprobs for {len(completion)} completion tokens")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in logprobs):
        raise MalformedRow("logprobs must be numbers")
    if any(x > 1e-4 for x in logprobs):
        raise MalformedRow("a logprob above 0 is not a log-probability")
    segment = Segment(
        token_ids=prompt + completion,
        logprobs=[0.0] * len(prompt) + [float(x) for x in logprobs],
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        policy_version=row.policy_version,
        temperature=row_temperature(row),
    )
    try:
        messages = [ChatMessageIn.model_validate(m).to_message() for m in row.request.get("messages", [])]
        answer = row.response.get("message", {}) or {}
    except (ValueError, TypeError, AttributeError) as exc:
        raise MalformedRow(f"stored request/response does not parse: {exc}") from exc
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
    exclude_versions: Collection[int] = (),
) -> tuple[list[Trajectory], StoreDataStats]:
    """Trajectories from interactions of versions ``latest - max_staleness .. latest`` that have feedback.

    Rows of ``exclude_versions`` (versions rolled back) are counted in ``stats.rolled_back`` and left out.

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
    excluded = {int(v) for v in exclude_versions}
    stats.rolled_back = sum(r.policy_version in excluded for r in rows)
    rows = [r for r in rows if r.policy_version not in excluded]
    feedback = defaultdict(list)
    for item in store.feedback(interaction_ids=[r.id for r in rows]) if rows else []:
        feedback[item.interaction_id].append(item)
    trajectories = []
    for row in rows:
        reward = reward_map.reward(feedback.get(row.id, []))
        if reward is None:
            stats.without_feedback += 1
            continue
        if not math.isfinite(reward):
            stats.non_finite += 1
            continue
        if not row.delivered:
            stats.undelivered += 1
            continue
        if not row.prompt_token_ids or not row.completion_token_ids:
            stats.without_tokens += 1
            continue
        if isinstance(row.logprobs, list) and any(
            isinstance(x, float) and not math.isfinite(x) for x in row.logprobs
        ):
            stats.non_finite += 1
            continue
        try:
            group = {"prompt": _prompt_key(list(row.prompt_token_ids)), "session": row.session_id, "none": None}
            trajectories.append(interaction_trajectory(row, reward, group[group_by]))
        except (MalformedRow, ValueError, TypeError) as exc:
            stats.malformed += 1
            logger.warning("interaction %s skipped: %s", row.id, exc)
            continue
        stats.by_version[row.policy_version] = stats.by_version.get(row.policy_version, 0) + 1
    stats.used = len(trajectories)
    return trajectories, stats
