"""Tools: typed Python functions exposed to the model as OpenAI function schemas.

``@tool`` reads a function's signature, type hints and docstring (Google-style ``Args:``) into a schema;
arguments are validated before the call, each call has a timeout, and output is truncated to a cap with
a visible marker (error messages too). A ``ToolSet`` groups tools, runs one turn's calls concurrently (or one at a
time in call order, ``sequential``, for tools that share state), caps calls per turn (``max_parallel``) and adds
up per-call cost. Every failure becomes an error ``ToolResult``, never an
exception out of the agent loop, except an ``InfraError`` (the sandbox or a server failed, not the call): it
ends the episode as an infrastructure failure. A timeout ends the work, not only the wait: each call runs with
a ``CallBudget`` (``call_budget()`` inside the tool) that long-running tools check between pieces of work; on
timeout it is stopped and the call's thread (a daemon, so it can never keep the process alive) is given a moment to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import math
import re
import threading
import time
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args, get_origin

from taskrl.types import InfraError, ToolCall, ToolResult

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_OUTPUT_CHARS = 8000
TRUNCATION_MARKER = "\n[... output truncated: {n} more characters ...]"
_MAX_ITEM_PROBLEMS = 10
"""Wrong items of one array reported by name; the rest are counted (a 100k-item list must not make a 5 MB error)."""
STOP_GRACE_S = 0.1
"""How long a timed-out call's thread is awaited after its budget is stopped (cooperative tools end in time)."""

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
        bad = 0
        for i, item in enumerate(value):
            found = _check_value(item, schema["items"], f"{path}[{i}]")
            bad += bool(found)
            if bad <= _MAX_ITEM_PROBLEMS:
                problems += found
        if bad > _MAX_ITEM_PROBLEMS:
            problems.append(f"... and {bad - _MAX_ITEM_PROBLEMS} more items of {path} are wrong")
        return problems
    return []


def truncate_output(text: str, max_chars: int | None) -> str:
    """Cut ``text`` to ``max_chars`` and say how much was dropped, so the model knows it saw a part."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + TRUNCATION_MARKER.format(n=len(text) - max_chars)


class ToolStopped(RuntimeError):
    """Raised by ``CallBudget.check`` inside a tool whose call was stopped or ran past its deadline."""


class CallBudget:
    """The time one tool call may take and a stop flag; tools doing long work check it between pieces."""

    def __init__(self, timeout_s: float | None) -> None:
        self.deadline = time.monotonic() + timeout_s if timeout_s is not None else math.inf
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """True once the call was stopped or its deadline passed."""
        return self._stop.is_set() or time.monotonic() >= self.deadline

    def remaining(self) -> float:
        """Seconds left (0 once stopped; inf without a deadline)."""
        return 0.0 if self._stop.is_set() else max(self.deadline - time.monotonic(), 0.0)

    def check(self) -> None:
        if self.stopped:
            raise ToolStopped("the call was stopped (its time budget is spent)")


_BUDGET: contextvars.ContextVar[CallBudget | None] = contextvars.ContextVar("taskrl_call_budget", default=None)


def call_budget() -> CallBudget | None:
    """The budget of the tool call running in this thread or task; None outside a tool call."""
    return _BUDGET.get()


def _run_in_thread(
    fn: Callable[..., Any], kwargs: dict[str, Any], budget: CallBudget, name: str
) -> tuple[asyncio.Future[Any], threading.Thread]:
    """Start ``fn(**kwargs)`` in its own daemon thread with ``budget`` as its ``call_budget()``."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    # A call that timed out no longer awaits its future: retrieve a late exception so asyncio does not log it.
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
    context = contextvars.copy_context()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def work() -> None:
        _BUDGET.set(budget)
        try:
            value, setter = fn(**kwargs), future.set_result
        except BaseException as e:  # noqa: BLE001 - delivered to the awaiting call
            value, setter = e, future.set_exception
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for this result any more
            loop.call_soon_threadsafe(deliver, setter, value)

    thread = threading.Thread(target=context.run, args=(work,), name=f"taskrl-tool-{name}", daemon=True)
    thread.start()
    return future, thread


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

    def _error(self, call: ToolCall, message: str) -> ToolResult:
        """An error result, capped like any output (a message listing 100k bad ids must not fill the context)."""
        cap = self.max_output_chars or DEFAULT_MAX_OUTPUT_CHARS
        return ToolResult(call.id, self.name, truncate_output(message, cap), True)

    async def __call__(self, call: ToolCall) -> ToolResult:
        """Validate, run with the timeout (stopping the work when it expires), stringify and truncate. Never raises."""
        problems = self.validate(call.arguments)
        if problems:
            return self._error(call, f"Invalid call to '{self.name}': " + "; ".join(problems))
        budget = CallBudget(self.timeout_s)
        deadline = asyncio.timeout(self.timeout_s)
        thread: threading.Thread | None = None
        token = _BUDGET.set(budget)
        try:
            async with deadline:
                if inspect.iscoroutinefunction(self.fn):  # also sees through functools.partial
                    out = await self.fn(**call.arguments)
                elif self.in_thread:
                    future, thread = _run_in_thread(self.fn, call.arguments, budget, self.name)
                    out = await asyncio.shield(future)
                else:
                    out = self.fn(**call.arguments)
        except TimeoutError as e:
            if not deadline.expired():  # the tool itself raised TimeoutError: report it like any failure
                return self._error(call, f"Tool '{self.name}' failed: TimeoutError: {e}")
            note = await _stop(budget, thread)
            return self._error(call, f"Tool '{self.name}' timed out after {self.timeout_s:g}s{note}")
        except ToolStopped:
            return self._error(call, f"Tool '{self.name}' timed out after {self.timeout_s:g}s")
        except InfraError:  # a broken sandbox or server is no observation: it ends the episode, unscored
            raise
        except Exception as e:  # noqa: BLE001 - a tool's failure is an observation for the model
            return self._error(call, f"Tool '{self.name}' failed: {type(e).__name__}: {e}")
        finally:
            budget.stop()  # also when the episode is cancelled: the work must not outlive its call
            _BUDGET.reset(token)
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
    sequential: bool = False
    """Run a turn's calls one at a time, in call order. For tools that share state (a token budget, the chunks
    already shown, a file two calls edit): run concurrently, what each call returns would depend on which thread
    got there first, so the same turn could show the model different observations from run to run."""

    def __post_init__(self) -> None:
        self._by_name: dict[str, Tool] = {}
        for t in self.tools:
            if t.name in self._by_name:
                raise ToolDefinitionError(f"two tools are named '{t.name}'")
            self._by_name[t.name] = t
        if self.max_parallel is not None and self.max_parallel < 1:
            raise ValueError(f"ToolSet.max_parallel must be >= 1 or None, got {self.max_parallel}")

    @classmethod
    def from_object(cls, obj: Any, *, max_parallel: int | None = None, sequential: bool = False) -> ToolSet:
        """Collect the ``@tool`` methods of an object (e.g. an env instance), bound to it."""
        found = [getattr(obj, n) for n, v in inspect.getmembers(type(obj)) if isinstance(v, Tool)]
        return cls(found, max_parallel=max_parallel, sequential=sequential)

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
            name = call.name if len(call.name) <= 100 else call.name[:100] + "..."
            return f"Unknown tool '{name}'. Available tools: {', '.join(self.names) or 'none'}."
        problems = t.validate(call.arguments)
        if problems:
            message = f"Invalid call to '{call.name}': " + "; ".join(problems) + "."
            return truncate_output(message, DEFAULT_MAX_OUTPUT_CHARS)
        return None

    def cost(self, calls: list[ToolCall]) -> float:
        return sum(self._by_name[c.name].cost for c in calls if c.name in self._by_name)

    async def execute(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Run calls concurrently (``sequential``: one after another); results come back in call order. Never
        raises."""
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
        if self.sequential:  # a coroutine starts when awaited: each call sees the state the calls before it left
            return [await job for job in jobs]
        return list(await asyncio.gather(*jobs))


async def _stop(budget: CallBudget, thread: threading.Thread | None) -> str:
    """Stop a timed-out call and give its thread ``STOP_GRACE_S`` to end; a note when it did not."""
    budget.stop()
    if thread is None:
        return ""
    end = time.monotonic() + STOP_GRACE_S
    while thread.is_alive() and time.monotonic() < end:
        await asyncio.sleep(0.005)
    return " (its work is still ending in the background)" if thread.is_alive() else ""


async def _error(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(call.id, call.name, truncate_output(message, DEFAULT_MAX_OUTPUT_CHARS), is_error=True)
