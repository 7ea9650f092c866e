"""What the monitors read from one trajectory: tool calls, success, independent checks, sub-agent concurrency."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from taskrl.monitors.config import MonitorConfig
from taskrl.rewards.formulas import max_overlap
from taskrl.rewards.parl import TASK_SIZE_KEY, subtasks
from taskrl.types import Trajectory

FAILED_CHECKS_KEY = "failed_checks"
"""``trajectory.info["failed_checks"]``: names of the independent checks the episode failed, written by any env
(``[]`` = its checks ran and passed). The reward-hacking monitor reads it beside the configured flag keys."""

EPS = 1e-9  # rewards are float sums: 0.9999999 must still count as reaching a threshold of 1.0
_CLARIFYING_RE = re.compile(
    r"\b(could|can|would) you (please )?(clarify|confirm|specify|provide|tell me)\b|\bdo you want me to\b"
    r"|\bwould you like me to\b|\bplease (clarify|confirm|specify)\b",
    re.I,
)


def tool_calls(traj: Trajectory) -> list[tuple[str, str]]:
    """(name, canonical JSON arguments) of every call the model wrote, in order."""
    return [
        (c.name, json.dumps(c.arguments, sort_keys=True, default=str))
        for m in traj.messages
        if m.role == "assistant"
        for c in m.tool_calls
    ]


def is_success(traj: Trajectory, threshold: float) -> bool:
    return traj.error is None and traj.reward >= threshold - EPS


def _lookup(traj: Trajectory, key: str) -> Any:
    """A recorded value from metrics first, then info; None when the trajectory does not carry it."""
    return traj.metrics[key] if key in traj.metrics else traj.info.get(key)


def failed_checks(traj: Trajectory, config: MonitorConfig) -> list[str] | None:
    """The independent checks this trajectory fails; None when it carries no check at all.

    Reads ``info["failed_checks"]`` (a list of names; any env can raise flags there without a config change), the
    ``hacking_flags`` keys (truthy = failed) and the ``hacking_required`` keys (present and falsy = failed).
    """
    carried, failed = False, []
    listed = traj.info.get(FAILED_CHECKS_KEY)
    if isinstance(listed, list | tuple):
        carried = True
        failed += [str(name) for name in listed]
    for key in config.hacking_flags:
        value = _lookup(traj, key)
        if value is not None:
            carried = True
            if value:
                failed.append(key)
    for key in config.hacking_required:
        value = _lookup(traj, key)
        if value is not None:
            carried = True
            if not value:
                failed.append(key)
    return failed if carried else None


def assign_tool(subagent_tools: Sequence[str]) -> str:
    """The tool of ``subagent_tools`` that launches sub-tasks (not the one that creates sub-agents)."""
    return next((name for name in subagent_tools if name != "create_subagent"), "assign_task")


def max_concurrency(traj: Trajectory, subagent_tools: Sequence[str] = ("assign_task",)) -> int:
    """Most sub-agents running at one step: from the children on the step clock (``taskrl.rewards.parl``: the
    turn that launched each, its steps, one task at a time per agent), not wall-clock time, so a helper that
    answers instantly is as parallel as a slow one; without children, the most assignments in one turn."""
    if traj.children:
        return max_overlap([(t.start, t.end) for t in subtasks(traj, assign_tool(subagent_tools))])
    assign = [name for name in subagent_tools if name != "create_subagent"] or list(subagent_tools)
    per_turn = [sum(c.name in assign for c in m.tool_calls) for m in traj.messages if m.role == "assistant"]
    return max(per_turn, default=0)


def task_size(traj: Trajectory) -> int:
    """Independent items the episode's task asks for (``info["task_size"]``, written by the swarm env); 1 if unknown."""
    size = traj.info.get(TASK_SIZE_KEY)
    return max(1, int(size)) if isinstance(size, int | float) else 1


def child_spans(traj: Trajectory) -> list[tuple[float, float]]:
    """Wall-clock ``(started_at, ended_at)`` of the children that recorded both (for the report's timeline)."""
    spans = []
    for child in traj.children:
        start, end = child.info.get("started_at"), child.info.get("ended_at")
        if isinstance(start, int | float) and isinstance(end, int | float):
            spans.append((float(start), float(max(end, start))))
    return spans


def is_question(text: str | None) -> bool:
    """A reply that asks the user something instead of answering (Composer's clarifying-question hack)."""
    text = (text or "").strip()
    return bool(text) and (text.endswith("?") or _CLARIFYING_RE.search(text) is not None)


def _entropy_bits(counts: Iterable[int]) -> float:
    values = [c for c in counts if c > 0]
    total = sum(values)
    return max(0.0, -sum(c / total * math.log2(c / total) for c in values)) if total else 0.0  # no -0.0


def _rate(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None
