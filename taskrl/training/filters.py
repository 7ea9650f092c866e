"""What an RL step trains on, beyond the algorithm: DAPO's dynamic sampling, overlong filtering, and the check that
a step has any episode its infrastructure did not fail (``check_infra_failures``).

``fill_batch(first, play_more, groups_wanted=..., max_rounds=...)`` keeps the groups whose rewards differ, plays
more tasks until ``groups_wanted`` such groups are in hand (or ``max_rounds`` extra rounds are spent) and
reports how many groups were drawn, dropped and trimmed. ``overlong(trajectory)`` says whether an episode was cut
off by the token budget, so the learner can leave it out of the loss. The trainer and learner apply them from
``TrainConfig`` (``dynamic_sampling``, ``overlong_filter``); the algorithm files never read these fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from taskrl.types import Trajectory

TOKEN_BUDGET_TRUNCATIONS = ("max_new_tokens", "max_context_tokens")
"""``Trajectory.info["truncation"]`` values that mean the token budget cut the episode off (DAPO's overlong)."""


def overlong(trajectory: Trajectory) -> bool:
    """Whether a token budget cut the episode off (a turn's ``max_new_tokens`` or the context's
    ``max_context_tokens``) or cut any of its turns short (``metrics["capped_turns"]``: the loop still runs the
    complete calls of a capped turn, so a policy can lean on the cap to end its turn instead of ending it; the
    issue-40 ladder's RL arms did). A turn limit or an env's own truncation is not overlong."""
    cut = bool(trajectory.truncated) and trajectory.info.get("truncation") in TOKEN_BUDGET_TRUNCATIONS
    return cut or trajectory.metrics.get("capped_turns", 0.0) > 0


def groups_of(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Trajectories grouped by ``group_id`` in first-seen order; one without a group id is a group of its own."""
    members: dict[object, list[Trajectory]] = {}
    for i, t in enumerate(trajectories):
        members.setdefault(t.group_id if t.group_id is not None else ("__alone__", i), []).append(t)
    return list(members.values())


def has_signal(group: Sequence[Trajectory]) -> bool:
    """Whether a group's rewards differ (a group-relative advantage is non-zero somewhere); errored and
    untrainable episodes still count, as the learner would count them."""
    rewards = [t.reward for t in group]
    return len(rewards) > 1 and max(rewards) - min(rewards) > 1e-12


@dataclass
class FilledBatch:
    """One step's batch after dynamic sampling."""

    train: list[Trajectory]
    """What the learner trains on: at most ``groups_wanted`` groups with signal, in the order they were played."""
    played: list[Trajectory] = field(default_factory=list)
    """Every episode played for the step, all rounds (what the step's reward metrics and logs describe)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``charts/dynamic_*``: extra rounds, groups drawn, zero-variance groups dropped, surplus groups trimmed."""


def fill_batch(
    first: Sequence[Trajectory],
    play_more: Callable[[int, int], Sequence[Trajectory]],
    *,
    groups_wanted: int,
    max_rounds: int,
) -> FilledBatch:
    """DAPO dynamic sampling: drop zero-variance groups and play more until ``groups_wanted`` groups with signal
    are in hand or ``max_rounds`` extra rounds have been played.

    ``play_more(round, tasks)`` plays and scores ``tasks`` more tasks (round 1, 2, ...). Each round asks for the
    missing groups divided by the share of groups with signal so far (all of ``groups_wanted`` when none had
    any), at most ``groups_wanted``; groups beyond ``groups_wanted`` are trimmed, latest first.
    """
    if groups_wanted < 1 or max_rounds < 0:
        raise ValueError(f"fill_batch needs groups_wanted >= 1 and max_rounds >= 0, got {groups_wanted}, {max_rounds}")
    played = list(first)
    groups = groups_of(played)
    kept = [g for g in groups if has_signal(g)]
    drawn, rounds = len(groups), 0
    while len(kept) < groups_wanted and rounds < max_rounds:
        rounds += 1
        missing = groups_wanted - len(kept)
        rate = len(kept) / drawn if drawn else 0.0
        ask = groups_wanted if rate == 0 else min(groups_wanted, math.ceil(missing / rate))
        more = list(play_more(rounds, ask))
        played += more
        new_groups = groups_of(more)
        drawn += len(new_groups)
        kept += [g for g in new_groups if has_signal(g)]
    with_signal = len(kept)
    kept = kept[:groups_wanted]
    metrics = {
        "charts/dynamic_rounds": float(rounds),
        "charts/dynamic_drawn_groups": float(drawn),
        "charts/dynamic_dropped_groups": float(drawn - with_signal),
        "charts/dynamic_trimmed_groups": float(with_signal - len(kept)),
        "charts/dynamic_kept_groups": float(len(kept)),
    }
    return FilledBatch([t for g in kept for t in g], played, metrics)


class InfraFailureError(RuntimeError):
    """Every episode of a step failed for infrastructure reasons (sandbox, engine, server): nothing to learn."""


def check_infra_failures(step: int, trajectories: Sequence[Trajectory]) -> None:
    """Raise when no episode of the step survived its infrastructure: training on nothing would hide the outage."""
    failures = [f for t in trajectories if (f := t.infra_failure) is not None]
    if trajectories and len(failures) == len(trajectories):
        sources = sorted({f.get("source", "?") for f in failures})
        raise InfraFailureError(
            f"step {step}: all {len(trajectories)} episodes failed for infrastructure reasons ({', '.join(sources)}; "
            f"first: {failures[0].get('detail', '?')}); fix the engine or sandbox named there, then resume the run"
        )
