"""Recorded search episodes for the reward tests: a Trajectory carrying what the search env writes (the info keys
the ``context1`` preset reads, assistant turns with their tool calls) and its EpisodeRecord, and ``rescore``, which
measures one with the env's rubric and scores it at an epoch of the β schedule."""

from __future__ import annotations

import dataclasses

from taskrl.envs.search.env import context1_reward
from taskrl.envs.search.reward import EpisodeRecord, RewardConfig
from taskrl.rewards.presets import ANSWER_LINE
from taskrl.scoring import Clock, score
from taskrl.types import Message, Task, ToolCall, Trajectory


def episode(
    output_docs: tuple[str, ...] = (),
    encountered: tuple[str, ...] = (),
    pruned: tuple[str, ...] = (),
    tool_calls: tuple[str, ...] = (),
    turns: int = 2,
    completed: bool = True,
    answer: str | None = None,
) -> tuple[Trajectory, EpisodeRecord]:
    """An episode as the search env records it: ``turns`` assistant turns, the first making ``tool_calls``; a
    completed one ends with a final answer listing ``output_docs``, an uncompleted one is truncated."""
    calls = [ToolCall(f"call{i}", name, {}) for i, name in enumerate(tool_calls)]
    messages = [Message("assistant", "", calls)] + [Message("assistant", "") for _ in range(turns - 1)]
    info: dict[str, object] = {
        "encountered_chunk_ids": list(encountered),
        "pruned_chunk_ids": sorted(pruned),
        "output_doc_ids": list(output_docs),
        ANSWER_LINE: answer,
    }
    if completed:
        info["final_answer"] = f"ANSWER: {answer or 'unknown'}\nDOCUMENTS: {', '.join(output_docs)}"
    traj = Trajectory(messages=messages[:turns], info=info, terminated=completed, truncated=not completed)
    record = EpisodeRecord(output_docs, frozenset(encountered), frozenset(pruned), tool_calls, turns, answer)
    return traj, record


def rescore(traj: Trajectory, task: Task, config: RewardConfig, epoch: int = 0) -> Trajectory:
    """A copy of ``traj`` measured by the search env's rubric and scored by it at ``epoch``."""
    rubric = context1_reward(config)
    copy = dataclasses.replace(traj, terms=rubric.measure(traj, task), rewards={}, metrics=dict(traj.metrics))
    score([copy], rubric, Clock(epoch=epoch))
    return copy
