"""A finished price episode built by hand, for the reward tests of the `shop` and `prices` envs."""

from __future__ import annotations

from taskrl.envs.builtin import PRICES
from taskrl.types import Message, Task, Trajectory


def episode(task: Task, looked_up: list[str], answer: str) -> Trajectory:
    """``task`` played by looking up ``looked_up`` (unknown items get the tool's error) and answering ``answer``."""
    messages = [Message("system", ""), Message("user", task.prompt)]
    for item in looked_up:
        known = item in PRICES
        messages.append(Message("tool", f"{item}: ${PRICES[item]}" if known else f"KeyError: no item '{item}'"))
    traj = Trajectory(task_id=task.id, messages=messages, terminated=True)
    traj.info["final_answer"] = answer
    return traj
