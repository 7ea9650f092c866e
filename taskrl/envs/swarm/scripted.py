"""Scripted orchestrators for swarm tasks: the fan-out expert (one helper per row, all in one turn) and the serial
single agent (one helper, one row per turn). Tests, the benchmark and cold-start data use them; they read only what
the model would see (the rows in the prompt, the helpers' answers).
"""

from __future__ import annotations

import re
from typing import Any

from taskrl.chat import format_tool_call
from taskrl.envs.swarm.tasks import render_table, split_rows
from taskrl.types import Message

SUBAGENT_INSTRUCTIONS = "You answer one search question about a document corpus. Search, then answer."
_ANSWER_RE = re.compile(r"ANSWER\s*:\s*(.+)", re.I)
_ROW_KEY_RE = re.compile(r"^\(row (\d+)\)", re.M)


def _rows(messages: list[Message]) -> dict[str, str]:
    return split_rows(next(m.content for m in messages if m.role == "user"))


def _answers(messages: list[Message]) -> dict[str, str]:
    """Row key -> a helper's answer, from each assign_task call's "(row k)" task header and its result."""
    agent_of_call = {c.id: c.arguments.get("task", "") for m in messages if m.role == "assistant" for c in m.tool_calls
                     if c.name == "assign_task"}  # fmt: skip
    out = {}
    for m in messages:
        if m.role == "tool" and m.name == "assign_task" and m.tool_call_id in agent_of_call:
            key = _ROW_KEY_RE.search(agent_of_call[m.tool_call_id])
            found = _ANSWER_RE.search(m.content)
            if key and found:
                out[key.group(1)] = found.group(1).strip()
    return out


def _task_text(key: str, question: str) -> str:
    return f"(row {key})\n{question}"


def fanout_rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Scripted orchestrator: one helper per row, all assigned in the first turn, then the answer table.

    The turn is written row by row (create row k's helper, assign it row k), so a model cloned on 1-2 row tasks
    has a per-row unit to repeat on a longer table; the env runs a turn's creates before its assignments anyway."""
    rows = _rows(messages)
    if not any(m.role == "assistant" for m in messages):
        calls = [call for k, q in rows.items() for call in (
            format_tool_call("create_subagent", {"name": f"row{k}", "system_prompt": SUBAGENT_INSTRUCTIONS}),
            format_tool_call("assign_task", {"agent_id": f"row{k}", "task": _task_text(k, q)}),
        )]  # fmt: skip
        return "\n".join(calls)
    return render_table({k: v for k, v in _answers(messages).items() if k in rows})


def serial_rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Scripted single agent: one helper does every row, one row per turn, then the answer table."""
    rows = _rows(messages)
    done = sum(c.name == "assign_task" for m in messages if m.role == "assistant" for c in m.tool_calls)
    if done >= len(rows):
        return render_table({k: v for k, v in _answers(messages).items() if k in rows})
    key, question = list(rows.items())[done]
    assign = format_tool_call("assign_task", {"agent_id": "helper", "task": _task_text(key, question)})
    if done == 0:
        create = format_tool_call("create_subagent", {"name": "helper", "system_prompt": SUBAGENT_INSTRUCTIONS})
        return f"{create}\n{assign}"
    return assign
