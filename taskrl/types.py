"""Core data types that flow through taskrl: messages, tool calls, token segments, trajectories.

Everything here is a plain dataclass that round-trips exactly through JSON (``to_json``/``from_json``),
so trajectories written by a rollout can be re-read by a trainer, a report or another process; task sets are
JSONL files of ``Task`` rows (``write_tasks``/``read_tasks``).
``SCHEMA_VERSION`` is bumped on any incompatible change; readers refuse newer versions.
Serialisation cannot be crashed by model output: values nested deeper than ``MAX_VALUE_DEPTH`` (a tool call's
arguments, ``info``) are stored as a truncated JSON string (``bound_value``), and objects JSON cannot hold as text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA_VERSION = 2
"""2: ``Trajectory.terms`` (the measured reward terms); version-1 files are read with their reward terms as the
measurements (``Trajectory.from_dict``), so re-scoring them gives their old totals."""
MAX_VALUE_DEPTH = 64
"""Deepest container nesting kept as structure inside one field; deeper values become a truncated string."""
MAX_ARGUMENT_CHARS = 65_536
"""Largest tool-call arguments (as JSON) a call may carry; larger ones are stored truncated and the call is invalid."""
TRUNCATED_KEY = "__truncated__"
"""Key of the stand-in dict for a value that was too deep or too large: ``{TRUNCATED_KEY: "<first chars>"}``."""

Role = Literal["system", "user", "assistant", "tool"]
INFRA_FAILURE_KEY = "infra_failure"
"""``Trajectory.info`` key of an infrastructure failure: ``{"source": ..., "detail": ...}`` (see ``InfraError``)."""


class InfraError(RuntimeError):
    """A failure of what runs the episode (its sandbox, engine or server), not of the policy. Such an episode
    says nothing about the policy: it is recorded (``Trajectory.infra_failure``), counted and left out of its
    group's statistics, never scored as a failure. Subclasses name their ``source``."""

    source = "env"


class SchemaVersionError(ValueError):
    """A serialised object was written by a newer taskrl than the one reading it."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def compact_json(value: Any, max_chars: int) -> str:
    """JSON-like text of ``value`` cut at about ``max_chars``, built with an explicit stack (any depth, any size)."""
    out: list[str] = []
    size = 0
    stack: list[Any] = [value]
    while stack and size < max_chars:
        item = stack.pop()
        if isinstance(item, _Lit):
            piece = item.text
        elif isinstance(item, dict):
            piece = "{"
            parts: list[Any] = []
            for i, (k, v) in enumerate(item.items()):
                parts += [_Lit(", " if i else ""), _Lit(json.dumps(str(k)) + ": "), v]
            stack += [_Lit("}"), *reversed(parts)]
        elif isinstance(item, list | tuple):
            piece = "["
            parts = []
            for i, v in enumerate(item):
                parts += [_Lit(", " if i else ""), v]
            stack += [_Lit("]"), *reversed(parts)]
        elif item is None or isinstance(item, bool | int | float | str):
            try:
                piece = json.dumps(item, ensure_ascii=False)
            except ValueError:  # an int too long for str(): its size is what matters
                piece = f"<int of {item.bit_length()} bits>"
        else:
            piece = json.dumps(str(item), ensure_ascii=False)
        out.append(piece)
        size += len(piece)
    text = "".join(out)
    return text[:max_chars] + ("..." if stack or len(text) > max_chars else "")


@dataclass(frozen=True)
class _Lit:
    """Literal text in ``compact_json``'s stack (brackets and separators)."""

    text: str


def value_depth(value: Any, limit: int) -> int:
    """Container nesting depth of ``value``, counted without recursion and no further than ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            depth += 1
            deepest = max(deepest, depth)
            if depth > limit:
                return deepest
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def bound_value(
    value: Any, *, max_depth: int = MAX_VALUE_DEPTH, max_chars: int | None = None
) -> tuple[Any, str | None]:
    """``(value, None)`` when it is within the limits, else ``({TRUNCATED_KEY: text}, why)``.

    ``text`` is the value's JSON cut to ``max_chars`` (or 2,000 characters when only the depth is exceeded).
    """
    problem = None
    if value_depth(value, max_depth) > max_depth:
        problem = f"nested deeper than {max_depth} levels"
    elif max_chars is not None:
        text = compact_json(value, max_chars + 1)
        if len(text) > max_chars:
            problem = f"larger than {max_chars:,} characters of JSON"
    if problem is None:
        return value, None
    return {TRUNCATED_KEY: compact_json(value, max_chars or 2000)}, problem


def bound_arguments(arguments: Any) -> tuple[Any, str | None]:
    """Tool-call arguments as a call may carry them, and why they were cut (the call is then invalid)."""
    return bound_value(arguments, max_depth=MAX_VALUE_DEPTH // 2, max_chars=MAX_ARGUMENT_CHARS)


def to_plain(obj: Any, depth: int = 0) -> Any:
    """JSON-ready copy of a dataclass tree (like ``dataclasses.asdict``) that no value can crash.

    Containers deeper than ``MAX_VALUE_DEPTH`` inside one field become ``{TRUNCATED_KEY: text}``; objects JSON
    cannot hold become their ``str``. Dataclass fields restart the depth count, so nested trajectories are kept.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict | list | tuple):
        if depth >= MAX_VALUE_DEPTH:
            return {TRUNCATED_KEY: compact_json(obj, 2000)}
        if isinstance(obj, dict):
            return {
                k if isinstance(k, str) else str(k): v if _plain_scalar(v) else to_plain(v, depth + 1)
                for k, v in obj.items()
            }
        return [v if _plain_scalar(v) else to_plain(v, depth + 1) for v in obj]
    if isinstance(obj, int) and not isinstance(obj, bool) and obj.bit_length() > _MAX_INT_BITS:
        return f"<int of {obj.bit_length()} bits>"  # json.dumps cannot write it (int/str conversion limit)
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return str(obj)


_SAFE_SCALARS = frozenset({str, float, bool, type(None)})
_MAX_INT_BITS = 4096 * 3  # well under the 4,300-digit limit of int -> str
_BIG_INT = 1 << _MAX_INT_BITS


def _plain_scalar(value: Any) -> bool:
    """A value ``to_plain`` returns as is (token ids and logprobs take this fast path)."""
    kind = type(value)
    return kind in _SAFE_SCALARS or (kind is int and -_BIG_INT < value < _BIG_INT)


@dataclass
class ToolCall:
    """One call the model asked for. ``arguments`` is already JSON-decoded."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass
class ToolResult:
    """What a tool call produced; ``is_error`` results are shown to the model like any other."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclass
class Message:
    """A chat message. Assistant messages carry ``tool_calls``; tool messages carry ``tool_call_id``."""

    role: Role
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    """A tool message whose result was an error (``ToolResult.is_error``, kept so nobody matches texts)."""

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_result(cls, result: ToolResult) -> Message:
        return cls(
            role="tool", content=result.content, tool_call_id=result.call_id, name=result.name, is_error=result.is_error
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        calls = [ToolCall(**c) for c in data.get("tool_calls") or []]
        return cls(
            role=data["role"],
            content=data.get("content") or "",
            tool_calls=calls,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            is_error=bool(data.get("is_error", False)),
        )


@dataclass
class Segment:
    """One contiguous token sequence the policy saw, exactly as tokenised.

    ``loss_mask[i]`` is 1 when token i was sampled by the policy and 0 for prompt, tool output or
    injected text. ``logprobs[i]`` is the sampler's log-probability of token i under the distribution it
    sampled from (temperature applied, no top-p/top-k truncation); it is 0.0 where ``loss_mask`` is 0.
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    policy_version: int = 0
    temperature: float | None = None
    """Temperature the sampled tokens were drawn at (``logprobs`` are of that distribution); None means the
    trainer's ``rollout.temperature``. Production rows served at their own temperature set it."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"Segment lengths differ: token_ids={n}, logprobs={len(self.logprobs)}, "
                f"loss_mask={len(self.loss_mask)}"
            )
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"Segment.temperature must be a finite number > 0 or None, got {self.temperature}")

    def __len__(self) -> int:
        return len(self.token_ids)

    def append(self, token_ids: list[int], *, sampled: bool, logprobs: list[float] | None = None) -> None:
        """Append tokens; sampled tokens need their logprobs, forced tokens get mask 0 and logprob 0."""
        if sampled:
            if logprobs is None or len(logprobs) != len(token_ids):
                raise ValueError("sampled tokens need one logprob each")
            self.logprobs.extend(float(x) for x in logprobs)
        else:
            self.logprobs.extend([0.0] * len(token_ids))
        self.token_ids.extend(int(t) for t in token_ids)
        self.loss_mask.extend([1 if sampled else 0] * len(token_ids))

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Task:
    """One problem an env can be reset to. ``answer`` is the gold answer (never shown to the model)."""

    id: str
    prompt: str
    answer: Any = None
    info: dict[str, Any] = field(default_factory=dict)


def write_tasks(tasks: Iterable[Task], path: str | Path) -> Path:
    """Write tasks as JSONL atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(dataclasses.asdict(t), ensure_ascii=False) + "\n" for t in tasks),
                   encoding="utf-8")  # fmt: skip
    tmp.replace(path)
    return path


def read_tasks(path: str | Path) -> list[Task]:
    """Tasks from JSONL written by ``write_tasks``; a bad line is an error naming the file and line."""
    tasks = []
    with Path(path).open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                tasks.append(Task(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: not a task row ({e})") from None
    return tasks


@dataclass
class Trajectory:
    """One episode: the messages, the exact tokens, the rewards and the metrics.

    ``terms`` holds what the env measured (unweighted, ``env.reward``); ``rewards`` the weighted terms that add up
    to the training reward, written from them by ``taskrl.scoring.score`` (a term may be ``None`` = "not
    applicable", which is excluded, not counted as zero); ``metrics`` holds unweighted diagnostics.
    ``terminated`` means the task ended (answer given, env said done); ``truncated`` means a budget was hit.
    Sub-agent episodes are nested in ``children`` with ``parent_id`` set and usually ``trainable=False``.
    """

    id: str = field(default_factory=lambda: new_id("traj"))
    task_id: str = ""
    env: str = ""
    group_id: str | None = None
    segments: list[Segment] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    rewards: dict[str, float | None] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    terms: dict[str, float | None] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    parent_id: str | None = None
    children: list[Trajectory] = field(default_factory=list)
    trainable: bool = True
    seed: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def reward(self) -> float:
        """The training reward: the sum of the applicable weighted terms."""
        return float(sum(v for v in self.rewards.values() if v is not None))

    @property
    def final_answer(self) -> str | None:
        return self.info.get("final_answer")

    @property
    def infra_failure(self) -> dict[str, str] | None:
        """``{"source": "sandbox"|"engine"|"env"|..., "detail": ...}`` when the episode's infrastructure failed:
        then it is out of its group's statistics and the advantages (``taskrl.scoring``, the learner)."""
        value = self.info.get(INFRA_FAILURE_KEY)
        return value if isinstance(value, dict) else None

    def mark_infra_failure(self, source: str, detail: str) -> None:
        """Record that the episode's ``source`` (sandbox, engine, env) failed: untrainable, and its ``error``."""
        self.info[INFRA_FAILURE_KEY] = {"source": source, "detail": detail[:2000]}
        self.error = self.error or detail
        self.trainable = False

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def num_sampled_tokens(self) -> int:
        return sum(s.num_sampled for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; values too deep to keep are truncated strings (``to_plain``), never a crash."""
        return to_plain(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        version = data.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"trajectory schema version {version} is newer than this taskrl ({SCHEMA_VERSION}); "
                "upgrade taskrl to read it"
            )
        data = dict(data)
        if version < 2 and "terms" not in data:  # v1: the reward terms were the only record of the measurements
            cap = "invalid_tool_call_cap"  # re-added by taskrl.scoring.score
            data["terms"] = {k: v for k, v in (data.get("rewards") or {}).items() if k != cap}
        data["schema_version"] = SCHEMA_VERSION
        data["segments"] = [Segment(**s) for s in data.get("segments", [])]
        data["messages"] = [Message.from_dict(m) for m in data.get("messages", [])]
        data["children"] = [cls.from_dict(c) for c in data.get("children", [])]
        return cls(**data)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))


def write_jsonl(path: str, trajectories: list[Trajectory], *, append: bool = True) -> None:
    """Write trajectories one per line, flushing so a crash never loses a finished episode."""
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(t.to_json() + "\n")
        f.flush()


def read_jsonl(path: str) -> list[Trajectory]:
    with open(path, encoding="utf-8") as f:
        return [Trajectory.from_json(line) for line in f if line.strip()]


def finite_mean(values: list[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else float("nan")
