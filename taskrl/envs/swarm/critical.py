"""Critical steps (docs/design/index.md §7): the length of the swarm episode's longest dependent chain of model steps.

critical_steps = Σ over orchestrator turns t of (S_main(t) + max_i S_sub,i(t)): sub-agents launched in one turn
run concurrently, so a turn costs its own step plus its slowest sub-agent. ``total_steps`` counts every step of
every agent. Inputs are plain lists so the same functions score live episodes, saved ones and benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence


def critical_steps(turns: Sequence[Sequence[int]], main_steps: int = 1) -> int:
    """Σ_t (main_steps + max steps of the sub-agents launched in turn t); a turn without sub-agents costs main_steps.

    ``turns[t]`` lists the step counts of the sub-agents the orchestrator launched in its turn t.
    """
    if main_steps < 0:
        raise ValueError(f"main_steps must be >= 0, got {main_steps}")
    for t, steps in enumerate(turns):
        if any(s < 0 for s in steps):
            raise ValueError(f"turn {t}: sub-agent step counts must be >= 0, got {list(steps)}")
    return sum(main_steps + max(steps, default=0) for steps in turns)


def total_steps(turns: Sequence[Sequence[int]], main_steps: int = 1) -> int:
    """Every step of every agent: the orchestrator's turns plus all sub-agent steps."""
    return sum(main_steps + sum(steps) for steps in turns)


def critical_members(turns: Sequence[Sequence[int]]) -> list[int | None]:
    """Per turn, the index (within that turn) of the sub-agent on the critical path (most steps; first on ties)."""
    return [max(range(len(steps)), key=lambda i: (steps[i], -i)) if steps else None for steps in turns]
