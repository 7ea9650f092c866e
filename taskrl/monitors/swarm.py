"""Swarm monitors (docs/design/index.md §7): serial collapse and spurious parallelism, on the step clock of
``taskrl.rewards.parl`` so a helper's latency never decides them."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from taskrl.monitors.config import MonitorConfig
from taskrl.monitors.episode import _rate, assign_tool, max_concurrency, task_size, tool_calls
from taskrl.rewards.formulas import max_overlap
from taskrl.rewards.parl import TASK_SIZE_KEY, subtasks
from taskrl.types import Trajectory

_WORD_RE = re.compile(r"[a-z0-9]{3,}")


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


def _trivial_task(text: object, min_words: int) -> bool:
    """An assignment that asks for nothing: fewer than ``min_words`` words of three letters or more."""
    return len(_WORD_RE.findall(str(text or "").lower())) < min_words


def _agents_created(t: Trajectory) -> int:
    """Sub-agents the episode created: the env's count, else the successful ``create_subagent`` calls."""
    recorded = t.info.get("subagents_created")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 0:
        return recorded
    failed = {m.tool_call_id for m in t.messages if m.role == "tool" and m.is_error}
    return sum(c.name == "create_subagent" and c.id not in failed
               for m in t.messages if m.role == "assistant" for c in m.tool_calls)  # fmt: skip


def wasted_share(t: Trajectory, cfg: MonitorConfig) -> tuple[float, int]:
    """(share wasted, units judged) of a swarm episode's sub-agents and assignments. Wasted: a created sub-agent
    never given a genuine sub-task (never assigned, or only decoys or trivial tasks), an assignment the env
    refused (an empty task, an unknown agent), a decoy, or a trivial task (fewer than
    ``spurious_min_task_words`` words). Units: sub-agents created plus assignments attempted."""
    assign = assign_tool(cfg.subagent_tools)
    tasks = subtasks(t, assign) if t.children else []
    attempted = max(len(tasks), sum(name == assign for name, _ in tool_calls(t)))
    created = max(_agents_created(t), len({s.agent for s in tasks}))
    texts = [t.children[s.index].info.get("task") for s in tasks]  # None: not recorded, not judged
    idle_task = [s.decoy or (text is not None and _trivial_task(text, cfg.spurious_min_task_words))
                 for s, text in zip(tasks, texts, strict=True)]  # fmt: skip
    genuine_agents = {s.agent for s, wasted in zip(tasks, idle_task, strict=True) if not wasted}
    wasted = (created - len(genuine_agents)) + (attempted - len(tasks)) + sum(idle_task)
    units = created + attempted
    return (wasted / units if units else 0.0), units


def spurious_parallelism(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of swarm episodes with spurious parallelism: sub-tasks launched together (turns with >=
    ``spurious_min_subagents`` assignments) more than ``spurious_max_wasted`` decoys (dummies, padding, one part
    assigned many times, "unknown" replies; where the env does not judge, any sub-task that added no distinct
    answer), or, over the whole episode, more than that share of its sub-agents and assignments wasted
    (``wasted_share``: created and never assigned, given empty or trivial tasks), so an idle swarm counts too."""
    flags = []
    for t in trajs:
        if not _is_swarm(t, cfg):
            continue
        tasks = subtasks(t, assign_tool(cfg.subagent_tools)) if t.children else []
        per_turn = Counter(s.turn for s in tasks)
        together = [s for s in tasks if per_turn[s.turn] >= cfg.spurious_min_subagents]
        wasted = sum(s.decoy for s in together)
        launched = bool(together) and wasted / len(together) > cfg.spurious_max_wasted
        share, units = wasted_share(t, cfg)
        flags.append(launched or (units >= cfg.spurious_min_subagents and share > cfg.spurious_max_wasted))
    return _rate(flags)
