"""A builder for trajectories shaped exactly as the agent loop records them (for reward unit tests)."""

from __future__ import annotations

from typing import Any

import pytest

from taskrl.types import Message, ToolCall, Trajectory


class Builder:
    """``Builder("prompt").turn(("tool", {args}, "result"), ...).answer("text")`` -> Trajectory."""

    def __init__(self, prompt: str = "the task") -> None:
        self.messages = [Message("system", "system prompt"), Message("user", prompt)]
        self.calls = 0

    def turn(self, *calls: tuple[str, dict[str, Any], str]) -> Builder:
        tool_calls = []
        results = []
        for name, args, result in calls:
            call = ToolCall(f"call_{self.calls}", name, args)
            self.calls += 1
            tool_calls.append(call)
            results.append(Message("tool", result, tool_call_id=call.id, name=name))
        self.messages += [Message("assistant", "", tool_calls=tool_calls), *results]
        return self

    def answer(self, text: str | None, **info: Any) -> Trajectory:
        messages = list(self.messages)
        traj = Trajectory(task_id="t", messages=messages, terminated=text is not None, info=dict(info))
        if text is not None:
            messages.append(Message("assistant", text))
            traj.info["final_answer"] = text
        return traj


@pytest.fixture
def build() -> type[Builder]:
    return Builder
