"""Swarm monitors (DESIGN §7): serial collapse and spurious parallelism, on the step clock of
``taskrl.rewards.parl`` so a helper's latency never decides them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from taskrl.monitors.config import MonitorConfig
from taskrl.monitors.episode import _rate, assign_tool, max_concurrency, task_size, tool_calls
from taskrl.rewards.parl import TASK_SIZE_KEY, max_overlap, subtasks
from taskrl.types import Trajectory


def _is_swarm(t: Trajectory, cfg: MonitorConfig) -> bool:
    return bool(t.children) or any(name in cfg.subagent_tools for name, _ in tool_calls(t))


def _sized(t: Trajectory) -> bool:
    """A task of one item cannot be split, so it is not judged for parallelism (unknown size is judged)."""
    return TASK_SIZE_KEY not in t.info or task_size(t) >= 2


def serial_collapse(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of swarm episodes (of tasks with >= 2 items) that never had two genuine sub-tasks running at one step.

    Genuine = not a decoy (``taskrl.rewards.parl``: an honest attempt at a distinct part, answered or not), so
    solving serially beside dummies is collapse too. Without children: the most assignments in one turn."""
    flags = []
    for t in trajs:
        if not (_is_swarm(t, cfg) and _sized(t)):
            continue
        if t.children:
            genuine = [(s.start, s.end) for s in subtasks(t, assign_tool(cfg.subagent_tools)) if not s.decoy]
            flags.append(max_overlap(genuine) <= 1)
        else:
            flags.append(max_concurrency(t, cfg.subagent_tools) <= 1)
    return _rate(flags)


def spurious_parallelism(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of swarm episodes whose sub-tasks launched together (turns with >= ``spurious_min_subagents``
    assignments) are more than ``spurious_max_wasted`` decoys: dummies, padding, one part assigned many times,
    "unknown" replies (where the env does not judge, any sub-task that added no distinct answer)."""
    flags = []
    for t in trajs:
        if not _is_swarm(t, cfg):
            continue
        tasks = subtasks(t, assign_tool(cfg.subagent_tools)) if t.children else []
        per_turn = Counter(s.turn for s in tasks)
        together = [s for s in tasks if per_turn[s.turn] >= cfg.spurious_min_subagents]
        wasted = sum(s.decoy for s in together)
        flags.append(bool(together) and wasted / len(together) > cfg.spurious_max_wasted)
    return _rate(flags)
