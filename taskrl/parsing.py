"""Model output -> tool calls and final answers, for Hermes ``<tool_call>`` text and OpenAI ``tool_calls``.

``parse_turn`` never raises: every malformed call (bad JSON, unterminated tag, unknown tool, wrong
argument types) becomes an error ``ToolResult`` whose text tells the model what was wrong, so the loop can
show it on the next turn and count it in ``metrics["invalid_tool_calls"]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from taskrl.tools import ToolSet
from taskrl.types import ToolCall, ToolResult, bound_arguments

# A call's body ends at its closing tag; an unterminated one ends where the next call opens or the text ends.
_CALL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|(?=<tool_call>)|$)", re.S)
_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)
CALL_FORMAT_HINT = 'Write each call as <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>.'


@dataclass
class ParsedTurn:
    """What one assistant turn asked for."""

    content: str
    """The text outside any tool-call block."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Calls that parsed and validated; these go to the env."""
    invalid: list[tuple[ToolCall, ToolResult]] = field(default_factory=list)
    """Calls that did not, each with the error result the model will see."""
    all_calls: list[ToolCall] = field(default_factory=list)
    """Every call in the order the model wrote it, valid or not (for the assistant message)."""

    @property
    def is_final(self) -> bool:
        """A turn with no tool call at all (valid or not) is the final answer."""
        return not self.tool_calls and not self.invalid

    @property
    def final_answer(self) -> str:
        m = _ANSWER_RE.search(self.content)
        return (m.group(1) if m else self.content).strip()


def _loads(text: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why) when ``text`` is not JSON that Python can hold."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, e.msg
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as e:  # e.g. an integer longer than Python's int/str conversion limit
        return None, str(e).split(":")[0]


def _decode_call(raw: str) -> tuple[str | None, Any, str | None]:
    """(name, arguments, error) from one call's JSON body."""
    body = raw.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    obj, problem = _loads(body)
    if problem is not None:
        return None, None, f"Invalid tool call: not valid JSON ({problem}). {CALL_FORMAT_HINT}"
    if not isinstance(obj, dict):
        return None, None, f"Invalid tool call: it must be a JSON object. {CALL_FORMAT_HINT}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, None, f"Invalid tool call: it has no \"name\" string. {CALL_FORMAT_HINT}"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        decoded, problem = _loads(args) if args.strip() else ({}, None)
        if problem is not None:
            problem = f"arguments of '{name}' are not valid JSON ({problem})"
            return name, args, f"Invalid tool call: {problem}. {CALL_FORMAT_HINT}"
        args = decoded
    if not isinstance(args, dict):
        return name, args, f"Invalid tool call: the arguments of '{name}' must be a JSON object. {CALL_FORMAT_HINT}"
    return name, args, None


def _classify(
    calls: list[tuple[ToolCall, str | None]], content: str, tools: ToolSet | None
) -> ParsedTurn:
    turn = ParsedTurn(content=content)
    for call, error in calls:
        bounded, problem = bound_arguments(call.arguments)
        if problem is not None:  # kept as a truncated string: nothing downstream can choke on it
            call = ToolCall(call.id, call.name, bounded)
            error = error or f"Invalid tool call: the arguments of '{call.name}' are {problem}. Send smaller arguments."
        turn.all_calls.append(call)
        if error is None and tools is not None:
            error = tools.check_call(call)
        if error is None:
            turn.tool_calls.append(call)
        else:
            turn.invalid.append((call, ToolResult(call.id, call.name, error, is_error=True)))
    return turn


def parse_hermes(text: str, tools: ToolSet | None = None, *, id_prefix: str = "call", start: int = 0) -> ParsedTurn:
    """Parse ``<tool_call>{json}</tool_call>`` blocks; call ids are ``{id_prefix}_{start + i}``."""
    calls: list[tuple[ToolCall, str | None]] = []
    for i, m in enumerate(_CALL_RE.finditer(text)):
        call_id = f"{id_prefix}_{start + i}"
        name, args, error = _decode_call(m.group(1))
        if error is None and not m.group(2):
            error = f"Invalid tool call: missing the closing </tool_call> tag. {CALL_FORMAT_HINT}"
        arguments = args if isinstance(args, dict) else {"__raw__": m.group(1).strip()}
        calls.append((ToolCall(call_id, name or "invalid_tool_call", arguments), error))
    content = _CALL_RE.sub("", text).strip()
    return _classify(calls, content, tools)


def parse_openai(
    content: str | None,
    tool_calls: list[ToolCall],
    tools: ToolSet | None = None,
) -> ParsedTurn:
    """Validate calls a server already parsed (OpenAI ``tool_calls``); raw undecodable args are errors."""
    calls: list[tuple[ToolCall, str | None]] = []
    for call in tool_calls:
        error = None
        if "__raw__" in call.arguments and len(call.arguments) == 1:
            error = f"the arguments of '{call.name}' are not valid JSON. Send a JSON object."
        calls.append((call, error))
    return _classify(calls, (content or "").strip(), tools)
