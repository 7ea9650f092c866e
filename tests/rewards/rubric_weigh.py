"""``weigh``: the weighted terms a rubric gives one episode at a clock, for the preset and term tests."""

from __future__ import annotations

import dataclasses

from taskrl.scoring import Clock, Rubric, score
from taskrl.types import Task, Trajectory


def weigh(rubric: Rubric, trajectory: Trajectory, task: Task | None = None, clock: Clock | None = None) -> dict:
    """``trajectory`` measured by ``rubric`` and scored alone at ``clock`` (default the start; group terms None),
    on a copy without the loop's metrics (so without the invalid-call cap they trigger): its ``rewards``."""
    copy = dataclasses.replace(trajectory, terms=rubric.measure(trajectory, task), rewards={}, metrics={})
    score([copy], rubric, clock or Clock(), task_of=lambda _: task)
    return copy.rewards
