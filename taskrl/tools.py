"""Tools: typed Python functions exposed to the model as OpenAI function schemas.

``@tool`` reads a function's signature, type hints and docstring (Google-style ``Args:``) into a schema;
arguments are validated before the call, each call has a timeout, and output is truncated to a cap with
a visible marker. A ``ToolSet`` groups tools, runs one turn's calls concurrently, caps calls per turn
(``max_parallel``) and adds up per-call cost. Every failure becomes an error ``ToolResult``, never an
exception out of the agent loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args, get_origin

from taskrl.types import ToolCall, ToolResult

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_OUTPUT_CHARS = 8000
TRUNCATION_MARKER = "\n[... output truncated: {n} more characters ...]"

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolDefinitionError(TypeError):
    """A function cannot be turned into a tool (missing hints, unsupported types)."""


def _type_schema(tp: Any, where: str) -> dict[str, Any]:
    origin = get_origin(tp)
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    if origin is Literal:
        values = list(get_args(tp))
        kinds = {type(v) for v in values}
        schema: dict[str, Any] = {"enum": values}
        if len(kinds) == 1 and next(iter(kinds)) in _JSON_TYPES:
            schema["type"] = _JSON_TYPES[next(iter(kinds))]
        return schema
    if tp is list or origin is list:
        args = get_args(tp)
        return {"type": "array", "items": _type_schema(args[0], where) if args else {}}
    if tp is dict or origin is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        schema = _type_schema(args[0], where) if len(args) == 1 else {"anyOf": [_type_schema(a, where) for a in args]}
        if len(args) < len(get_args(tp)):  # Optional[X]: models may send null, as HF's get_json_schema says
            schema["nullable"] = True
        return schema
    raise ToolDefinitionError(f"{where}: unsupported type {tp!r}; use str, int, float, bool, list, dict, Literal")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {arg: description})."""
    doc = inspect.cleandoc(doc or "")
    parts = re.split(r"^\s*(?:Args|Arguments|Parameters):\s*$", doc, maxsplit=1, flags=re.M)
    description = parts[0].strip()
    args: dict[str, str] = {}
    if len(parts) > 1:
        current = None
        for line in parts[1].splitlines():
            if re.match(r"^\s*(Returns|Raises|Yields|Examples?):\s*$", line):
                break
            m = re.match(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if m:
                current = m.group(1)
                args[current] = m.group(2).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return description, args


def _check_value(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Return the problems with ``value`` against a (small subset of) JSON schema."""
    if value is None and schema.get("nullable"):
        return []
    if "anyOf" in schema:
        if any(not _check_value(value, s, path) for s in schema["anyOf"]):
            return []
        return [f"{path} has the wrong type ({type(value).__name__})"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path} must be one of {schema['enum']}, got {value!r}"]
    kind = schema.get("type")
    ok = {
        None: True,
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[kind]
    if not ok:
        return [f"{path} must be {kind}, got {type(value).__name__} {json.dumps(value)[:40]}"]
    if kind == "array" and schema.get("items"):
        problems: list[str] = []
        for i, item in enumerate(value):
            problems += _check_value(item, schema["items"], f"{path}[{i}]")
        return problems
    return []


def truncate_output(text: str, max_chars: int | None) -> str:
    """Cut ``text`` to ``max_chars`` and say how much was dropped, so the model knows it saw a part."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + TRUNCATION_MARKER.format(n=len(text) - max_chars)


@dataclass
class Tool:
    """A callable the model can use. Build with ``@tool``; bound automatically when used as a method."""

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    cost: float = 0.0
    max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS
    group: str = "default"
    in_thread: bool = True
    """Run a sync tool in a worker thread so it cannot block other episodes; False runs it inline
    (saves ~50 us per call; only for cheap, non-blocking tools, and the timeout cannot interrupt it)."""
    takes_self: bool = False

    def __get__(self, instance: Any, owner: type | None = None) -> Tool:
        if instance is None or not self.takes_self:
            return self
        return replace(self, fn=functools.partial(self.fn, instance), takes_self=False)

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: Any) -> list[str]:
        """Problems with ``arguments``; empty when the call may run."""
        if not isinstance(arguments, dict):
            return [f"arguments must be a JSON object, got {type(arguments).__name__}"]
        props = self.parameters["properties"]
        problems = [f"missing required argument '{a}'" for a in self.parameters["required"] if a not in arguments]
        problems += [
            f"unknown argument '{a}' (expected: {', '.join(props) or 'none'})" for a in arguments if a not in props
        ]
        for a, v in arguments.items():
            if a in props:
                problems += _check_value(v, props[a], f"argument '{a}'")
        return problems

    async def __call__(self, call: ToolCall) -> ToolResult:
        """Validate, run with the timeout, stringify and truncate. Never raises."""
        problems = self.validate(call.arguments)
        if problems:
            return ToolResult(call.id, self.name, f"Invalid call to '{self.name}': " + "; ".join(problems), True)
        deadline = asyncio.timeout(self.timeout_s)
        try:
            async with deadline:
                if inspect.iscoroutinefunction(self.fn):  # also sees through functools.partial
                    out = await self.fn(**call.arguments)
                elif self.in_thread:
                    out = await asyncio.to_thread(self.fn, **call.arguments)
                else:
                    out = self.fn(**call.arguments)
        except TimeoutError as e:
            if not deadline.expired():  # the tool itself raised TimeoutError: report it like any failure
                return ToolResult(call.id, self.name, f"Tool '{self.name}' failed: TimeoutError: {e}", True)
            return ToolResult(
                call.id, self.name, f"Tool '{self.name}' timed out after {self.timeout_s:g}s", True
            )
        except Exception as e:  # noqa: BLE001 - a tool's failure is an observation for the model
            return ToolResult(call.id, self.name, f"Tool '{self.name}' failed: {type(e).__name__}: {e}", True)
        text = out if isinstance(out, str) else json.dumps(out, ensure_ascii=False, default=str)
        return ToolResult(call.id, self.name, truncate_output(text, self.max_output_chars))


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    cost: float = 0.0,
    max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS,
    group: str = "default",
    in_thread: bool = True,
) -> Any:
    """Turn a typed, documented function (sync or async) into a ``Tool``.

    Usable bare (``@tool``) or with options (``@tool(timeout_s=5, cost=0.1)``), on functions or methods.
    """

    def build(f: Callable[..., Any]) -> Tool:
        description, arg_docs = _parse_docstring(f.__doc__ or "")
        if not description:
            raise ToolDefinitionError(f"tool '{f.__name__}' needs a docstring: it becomes the description")
        hints = typing.get_type_hints(f)
        params = list(inspect.signature(f).parameters.values())
        takes_self = bool(params) and params[0].name == "self"
        if takes_self:
            params = params[1:]
        properties: dict[str, Any] = {}
        required: list[str] = []
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ToolDefinitionError(f"tool '{f.__name__}': *args/**kwargs cannot be described")
            if p.name not in hints:
                raise ToolDefinitionError(f"tool '{f.__name__}': argument '{p.name}' needs a type hint")
            prop = _type_schema(hints[p.name], f"tool '{f.__name__}' argument '{p.name}'")
            if p.name in arg_docs:
                prop["description"] = arg_docs[p.name]
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
            else:
                prop["default"] = p.default
            properties[p.name] = prop
        parameters = {"type": "object", "properties": properties, "required": required}
        return Tool(
            fn=f,
            name=name or f.__name__,
            description=description,
            parameters=parameters,
            timeout_s=timeout_s,
            cost=cost,
            max_output_chars=max_output_chars,
            group=group,
            in_thread=in_thread,
            takes_self=takes_self,
        )

    return build(fn) if fn is not None else build


@dataclass
class ToolSet:
    """The tools of one env. Runs a turn's calls concurrently, at most ``max_parallel`` of them."""

    tools: list[Tool] = field(default_factory=list)
    max_parallel: int | None = None
    """Most calls executed per turn; extra calls get an error result. None = no cap."""

    def __post_init__(self) -> None:
        self._by_name: dict[str, Tool] = {}
        for t in self.tools:
            if t.name in self._by_name:
                raise ToolDefinitionError(f"two tools are named '{t.name}'")
            self._by_name[t.name] = t
        if self.max_parallel is not None and self.max_parallel < 1:
            raise ValueError(f"ToolSet.max_parallel must be >= 1 or None, got {self.max_parallel}")

    @classmethod
    def from_object(cls, obj: Any, *, max_parallel: int | None = None) -> ToolSet:
        """Collect the ``@tool`` methods of an object (e.g. an env instance), bound to it."""
        found = [getattr(obj, n) for n, v in inspect.getmembers(type(obj)) if isinstance(v, Tool)]
        return cls(found, max_parallel=max_parallel)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Tool:
        return self._by_name[name]

    def __iter__(self) -> Iterable[Tool]:  # type: ignore[override]
        return iter(self.tools)

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for t in self.tools:
            out.setdefault(t.group, []).append(t.name)
        return out

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools]

    def check_call(self, call: ToolCall) -> str | None:
        """Why this call cannot run (unknown tool, bad arguments), as a message for the model; else None."""
        t = self._by_name.get(call.name)
        if t is None:
            return f"Unknown tool '{call.name}'. Available tools: {', '.join(self.names) or 'none'}."
        problems = t.validate(call.arguments)
        if problems:
            return f"Invalid call to '{call.name}': " + "; ".join(problems) + "."
        return None

    def cost(self, calls: list[ToolCall]) -> float:
        return sum(self._by_name[c.name].cost for c in calls if c.name in self._by_name)

    async def execute(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Run calls concurrently; results come back in call order. Never raises."""
        limit = len(calls) if self.max_parallel is None else self.max_parallel
        if len(calls) == 1:  # the common case: no task to create
            problem = self.check_call(calls[0])
            return [await (_error(calls[0], problem) if problem else self._by_name[calls[0].name](calls[0]))]
        jobs = []
        for i, call in enumerate(calls):
            if i >= limit:
                jobs.append(_error(call, f"Too many tool calls in one turn: at most {limit} run; this one did not."))
            elif (problem := self.check_call(call)) is not None:
                jobs.append(_error(call, problem))
            else:
                jobs.append(self._by_name[call.name](call))
        return list(await asyncio.gather(*jobs))


async def _error(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(call.id, call.name, message, is_error=True)
