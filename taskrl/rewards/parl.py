"""PARL credit for useful parallelism only (docs/design/index.md §7, docs/design/swarm.md): what each sub-task
of a swarm episode was worth, its place on a step clock, and the reward terms built on that.

``subtasks(trajectory)`` reads the children a swarm env attached. Per child it takes what the env judged
(``info["useful"]``, ``["subtask"]``, ``["decoy"]``, ``["step_start"]``/``["step_end"]``, ``["agent_id"]``,
``["turn"]``) and falls back to what any trajectory shows: a child is useful when it finished with a non-trivial
answer no earlier child gave, it ran in the turn of its ``assign_task`` call, one step per model turn, each child
on its own agent. The clock counts steps, not seconds, so credit never depends on a helper's latency.
Terms: ``UsefulParallelism`` (r_parallel), ``UsefulFinish`` (r_finish), ``CriticalEfficiency`` (not annealed).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from taskrl.rewards.formulas import max_overlap, r_efficiency, r_finish, r_parallel
from taskrl.scoring import TermFn
from taskrl.types import Task, Trajectory

TRIVIAL_ANSWERS = frozenset({
    "", "unknown", "n/a", "na", "none", "nothing", "null", "no answer", "not found", "i don't know", "i do not know",
    "idk", "?", "-", "...", "todo", "tbd", "error", "cannot answer", "can't answer", "no idea", "not sure",
})  # fmt: skip
"""Replies that say nothing: a sub-agent that ends with one of these did not finish its sub-task."""

TASK_SIZE_KEY = "task_size"
"""``trajectory.info["task_size"]``: independent items the task asks for (rows); caps the parallelism that earns
full credit and scales the monitors' per-episode thresholds. Absent = unknown."""


def normalize_answer(text: str | None) -> str:
    """Case, spacing, a leading "ANSWER:" and surrounding quotes/punctuation do not matter."""
    value = re.sub(r"^\s*(final\s+)?answer\s*:\s*", "", (text or "").strip(), flags=re.I)
    return " ".join(value.strip().strip("`'\".,;:!").lower().split())


def is_trivial(text: str | None) -> bool:
    """True for a reply that carries no result ("ANSWER: unknown", "n/a", empty)."""
    return normalize_answer(text) in TRIVIAL_ANSWERS


def child_steps(child: Trajectory) -> int:
    """Steps a sub-task took on the episode's critical path: its own critical steps when it ran sub-agents of its
    own (a nested swarm), else its model turns."""
    value = child.metrics.get("critical_steps", child.metrics.get("turns", 1.0))
    return max(0, int(value))


def _run(turns: Sequence[Sequence[tuple[Hashable, int]]], main_steps: int) -> tuple[list[list[tuple[int, int]]], int]:
    if main_steps < 0:
        raise ValueError(f"main_steps must be >= 0, got {main_steps}")
    out: list[list[tuple[int, int]]] = []
    clock = 0
    for t, turn in enumerate(turns):
        start = clock + main_steps
        busy: dict[Hashable, int] = {}
        spans = []
        for agent, steps in turn:
            if steps < 0:
                raise ValueError(f"turn {t}: sub-task step counts must be >= 0, got {steps}")
            begin = busy.get(agent, start)
            busy[agent] = begin + steps
            spans.append((begin, begin + steps))
        out.append(spans)
        clock = max([start, *busy.values()])
    return out, clock


def step_schedule(turns: Sequence[Sequence[tuple[Hashable, int]]], main_steps: int = 1) -> list[list[tuple[int, int]]]:
    """Step intervals ``[start, end)`` of every sub-task: ``turns[t]`` lists (agent, steps) in launch order.

    Turn t starts when turn t-1 ended; its own ``main_steps`` come first, then its sub-tasks run: tasks of
    different agents at once, tasks of one agent one after the other (an agent works on one task at a time).
    The turn ends with its slowest agent (``schedule_length``: the episode's critical steps, docs/design/index.md §7).
    """
    return _run(turns, main_steps)[0]


def schedule_length(turns: Sequence[Sequence[tuple[Hashable, int]]], main_steps: int = 1) -> int:
    """Critical steps: Σ_t (main_steps + the most steps any one agent spent in turn t)."""
    return _run(turns, main_steps)[1]


@dataclass(frozen=True)
class SubTask:
    """One sub-agent assignment as PARL credits it."""

    index: int
    """Position among ``trajectory.children``."""
    turn: int
    """Orchestrator turn that launched it."""
    agent: Hashable
    """Sub-agent that ran it."""
    start: int
    """Step it started on the episode's step clock."""
    end: int
    """Step it ended (exclusive)."""
    useful: bool
    """Finished with a non-trivial result that is used and not a repeat of an earlier sub-task's."""
    key: Hashable | None
    """What it contributed (a row); useful sub-tasks have distinct keys."""
    decoy: bool
    """Wasted on purpose: off-task, a repeat of a sub-task already running or solved, or padding."""


def _assign_turns(trajectory: Trajectory, tool: str) -> list[int]:
    turns: list[int] = []
    assistant = 0
    for m in trajectory.messages:
        if m.role == "assistant":
            turns += [assistant] * sum(c.name == tool for c in m.tool_calls)
            assistant += 1
    return turns


def subtasks(trajectory: Trajectory, assign_tool: str = "assign_task") -> list[SubTask]:
    """Every child of ``trajectory`` as a ``SubTask`` (see the module docstring for what is read)."""
    children = trajectory.children
    if not children:
        return []
    call_turns = _assign_turns(trajectory, assign_tool)
    turn_of = []
    for i, child in enumerate(children):
        turn = child.info.get("turn")
        if not isinstance(turn, int):
            # the k-th child ran in the turn of the k-th assignment; with nothing recorded, each is its own turn
            turn = call_turns[i] if len(call_turns) == len(children) else i
        turn_of.append(turn)
    agents = [child.info.get("agent_id", ("child", i)) for i, child in enumerate(children)]
    recorded = all(isinstance(c.info.get("step_start"), int) and isinstance(c.info.get("step_end"), int)
                   for c in children)  # fmt: skip
    if recorded:
        spans = [(int(c.info["step_start"]), int(c.info["step_end"])) for c in children]
    else:
        order = sorted(range(len(children)), key=lambda i: (turn_of[i], i))
        grouped: dict[int, list[int]] = {}
        for i in order:
            grouped.setdefault(turn_of[i], []).append(i)
        turns = [grouped[t] for t in sorted(grouped)]
        schedule = step_schedule([[(agents[i], max(1, child_steps(children[i]))) for i in turn] for turn in turns])
        spans = [(0, 0)] * len(children)
        for turn, turn_spans in zip(turns, schedule, strict=True):
            for i, span in zip(turn, turn_spans, strict=True):
                spans[i] = span
    out, seen = [], set()
    for i, child in enumerate(children):
        if "useful" in child.info:
            useful, key = bool(child.info["useful"]), child.info.get("subtask")
        else:
            answer = normalize_answer(child.final_answer)
            useful = child.error is None and not is_trivial(answer) and answer not in seen
            key = answer if useful else None
            seen.add(answer)
        decoy = bool(child.info["decoy"]) if "decoy" in child.info else not useful
        out.append(SubTask(i, turn_of[i], agents[i], spans[i][0], spans[i][1], useful, key, decoy))
    return out


def useful_overlap(tasks: Sequence[SubTask]) -> int:
    """Most distinct useful sub-tasks running at one step."""
    first: dict[Hashable, SubTask] = {}
    for t in tasks:
        if t.useful and t.key not in first:
            first[t.key] = t
    return max_overlap([(t.start, t.end) for t in first.values()])


def task_size(trajectory: Trajectory, task: Task | None) -> int | None:
    """Independent items of the task: ``trajectory.info["task_size"]``, else ``len(task.info["items"])``."""
    size = trajectory.info.get(TASK_SIZE_KEY)
    if size is None and task is not None and isinstance(task.info.get("items"), list):
        size = len(task.info["items"])
    return int(size) if isinstance(size, int | float) and size >= 1 else None


def _finished(trajectory: Trajectory) -> bool:
    return trajectory.terminated and not trajectory.truncated and trajectory.error is None


@dataclass(frozen=True)
class UsefulParallelism:
    """r_parallel = min(1, U / min(K, task size)) where U is the most distinct useful sub-tasks running at one
    step (U < 2 counts as 0: one at a time is not parallelism). 0 for a truncated or failed episode."""

    k: int = 4
    """Useful sub-tasks at once for full credit (fewer when the task has fewer items)."""
    assign_tool: str = "assign_task"
    """Tool whose calls launch sub-tasks (to place children on turns when the env did not)."""
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __post_init__(self) -> None:
        r_parallel(0, self.k)  # validates k

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        if not _finished(trajectory):
            return 0.0
        overlap = useful_overlap(subtasks(trajectory, self.assign_tool))
        size = task_size(trajectory, task)
        return r_parallel(overlap if overlap >= 2 else 0, min(self.k, size) if size else self.k)


def _assignments(trajectory: Trajectory, tasks: Sequence[SubTask], created_key: str) -> int:
    created = trajectory.info.get(created_key, 0)
    return max(len(tasks), int(created) if isinstance(created, int | float) else 0)


@dataclass(frozen=True)
class UsefulFinish:
    """r_finish = distinct useful sub-tasks / max(assignments, sub-agents created): a trivial reply, a repeat, a
    placeholder or an idle sub-agent earns nothing and dilutes the rest. 0 for a truncated or failed episode."""

    created_key: str = "subagents_created"
    """``trajectory.info`` key of the number of sub-agents created."""
    assign_tool: str = "assign_task"
    """Tool whose calls launch sub-tasks."""
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        if not _finished(trajectory):
            return 0.0
        tasks = subtasks(trajectory, self.assign_tool)
        useful = len({t.key for t in tasks if t.useful})
        return r_finish(useful, _assignments(trajectory, tasks, self.created_key))


@dataclass(frozen=True)
class CriticalEfficiency:
    """r_efficiency = r_perf · (1 − min(1, critical steps / budget)) · useful share of the assignments.

    Not annealed: once λ1 and λ2 are 0 it still ranks an answer reached in fewer critical steps, with less wasted
    work, above the same answer reached serially or with decoys. Scaled by r_perf, so failing fast earns nothing.
    Reads ``trajectory.metrics["critical_steps"]`` (the swarm env writes it); None when absent.
    """

    perf: TermFn
    """The r_perf term (the same one the reward's ``perf`` term uses)."""
    budget: int = 100
    """Critical steps at which the bonus reaches 0 (the episode's critical-step budget when it has one)."""
    created_key: str = "subagents_created"
    """``trajectory.info`` key of the number of sub-agents created."""
    assign_tool: str = "assign_task"
    """Tool whose calls launch sub-tasks."""
    value_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __post_init__(self) -> None:
        r_efficiency(0.0, 0, self.budget, 1.0)  # validates the budget

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        critical = trajectory.metrics.get("critical_steps")
        if critical is None:
            return None
        if not _finished(trajectory):
            return 0.0
        perf = self.perf(trajectory, task) or 0.0
        tasks = subtasks(trajectory, self.assign_tool)
        assignments = _assignments(trajectory, tasks, self.created_key)
        share = len({t.key for t in tasks if t.useful}) / assignments if assignments else 1.0
        return r_efficiency(float(perf), int(critical), self.budget, share)
