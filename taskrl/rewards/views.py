"""Read what a reward needs out of a Trajectory: tool calls paired with their results, canonical call keys,
invalid calls and the evidence the agent received.

Rewards run inside ``env.reward`` before the loop fills ``Trajectory.metrics``, so everything here is
derived from ``trajectory.messages`` alone; the same code scores a trajectory re-read from JSONL.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from taskrl.types import Message, ToolCall, Trajectory

INVALID_CALL_PREFIXES = ("Invalid tool call:", "Unknown tool '", "Invalid call to '")
"""How ``taskrl.parsing`` and ``ToolSet.check_call`` open the error result of a call that could not run."""


class Exchange(NamedTuple):  # a NamedTuple: built for every call of every scored episode, so it must be cheap
    """One tool call and the tool message that answered it (None if the episode ended before one came)."""

    call: ToolCall
    result: Message | None
    message_index: int
    """Index in ``trajectory.messages`` of the assistant message that made the call."""
    turn: int
    """0-based assistant turn that made the call."""

    @property
    def key(self) -> tuple[str, str]:
        return call_key(self.call)

    @property
    def is_error(self) -> bool:
        return self.result is not None and _is_error_message(self.result)

    @property
    def is_invalid(self) -> bool:
        """The call never ran: bad JSON, unknown tool or arguments that failed validation."""
        return self.result is not None and self.result.content.startswith(INVALID_CALL_PREFIXES)


def canonical_arguments(arguments: dict[str, Any]) -> str:
    """Arguments as JSON with sorted keys, so ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` are one call."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def call_key(call: ToolCall) -> tuple[str, str]:
    return call.name, canonical_arguments(call.arguments)


def _is_error_message(message: Message) -> bool:
    # ``Message.is_error`` carries ``ToolResult.is_error``; messages read from schema-1 files lack it, so the texts
    # every error result of the loop opens with still mark those.
    if message.is_error:
        return True
    text = message.content
    return text.startswith(INVALID_CALL_PREFIXES) or text.startswith(("Tool '", "Too many tool calls"))


def tool_exchanges(trajectory: Trajectory) -> list[Exchange]:
    """Every tool call of the episode in the order made, each with its result message."""
    results = {m.tool_call_id: m for m in trajectory.messages if m.role == "tool" and m.tool_call_id}
    out: list[Exchange] = []
    turn = -1
    for index, message in enumerate(trajectory.messages):
        if message.role != "assistant":
            continue
        turn += 1
        out.extend(Exchange(c, results.get(c.id), index, turn) for c in message.tool_calls)
    return out


def assistant_turns(trajectory: Trajectory) -> int:
    return sum(m.role == "assistant" for m in trajectory.messages)


def evidence_text(trajectory: Trajectory, *, include_prompt: bool = True) -> str:
    """What the agent was given or retrieved: successful tool results, plus system/user messages if asked."""
    roles = ("tool", "system", "user") if include_prompt else ("tool",)
    parts = [
        m.content for m in trajectory.messages if m.role in roles and not (m.role == "tool" and _is_error_message(m))
    ]
    return "\n".join(parts)


_NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w])")


_TABLE_LINE_RE = re.compile(r"^\s*\|(.*)\|\s*$", re.M)


def normalise_phrase(text: str) -> str:
    """Lower case, spaces collapsed, surrounding quotes and punctuation dropped: how phrase facts compare."""
    return " ".join(text.strip().strip("`'\".,;:!*_").lower().split())


def extract_facts(text: str) -> set[str]:
    """The facts a text states: its numbers (``extract_numbers``) and, in a Markdown table (``| a | b |`` lines),
    every cell that is not a number or a rule (normalised phrases). The default extractor of ``Grounding``: a
    fabricated table of names states facts even when its only numbers are its row numbers."""
    facts = set(extract_numbers(text))
    for line in _TABLE_LINE_RE.findall(text or ""):
        for cell in line.split("|"):
            phrase = normalise_phrase(cell)
            if phrase and set(phrase) - set("-: ") and not _NUMBER_RE.fullmatch(phrase.replace(" ", "")):
                facts.add(phrase)
    return facts


def states(text: str, fact: str, text_facts: set[str]) -> bool:
    """Whether ``text`` (whose extracted facts are ``text_facts``) states ``fact``: among its facts, or, for a
    phrase (not a number), found in it as whole words once both are normalised."""
    if fact in text_facts:
        return True
    if _NUMBER_RE.fullmatch(fact):
        return False
    return re.search(rf"(?<!\w){re.escape(fact)}(?!\w)", " ".join(text.lower().split())) is not None


def extract_numbers(text: str, *, ordered: bool = False) -> Any:
    """Numbers in ``text``, normalised ("1,200.50" -> "1200.5", "18.0" -> "18"): a set, or a list in order.

    The default fact extractor of the grounding check, and the number grammar of ``AnswerMatch("number")``.
    """
    found = []
    for raw in _NUMBER_RE.findall(text or ""):
        value = float(raw.replace(",", ""))
        found.append(str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value))
    return found if ordered else set(found)
