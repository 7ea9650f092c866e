"""Self-summarization (Composer): compact the context at a token trigger and continue from a summary.

Set ``RolloutConfig(summary=SummaryConfig(trigger_tokens=...))``. When the model's view reaches the trigger
after a turn, the agent loop appends ``SummaryConfig.prompt`` as a forced user message, samples the summary
(trainable tokens in the current segment, sharing the episode's reward like every segment), and replaces the
view with the episode's opening messages (system prompt + task) plus the summary; the next turn opens a new
Segment. Each compaction is recorded in ``trajectory.info["summaries"]``; metrics say how many, how much they
saved and how many tokens the summaries took. This module holds the prompts, the new view and the bookkeeping;
``rollout.py`` runs it.

``SummaryConfig.mode`` picks who writes the summary, so compaction strategies can be compared on one loop:
``self`` (the agent, in its own trainable tokens), ``prompted`` (the harness sends the same policy a separate,
engineered summarisation request over the transcript: not in the episode's tokens, never trained) or
``state_dump`` (the harness writes a deterministic list of every tool call and its result so far: no model call).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from taskrl.types import Message

MODES = ("self", "prompted", "state_dump")
HARNESS_SYSTEM = (
    "You compress the working context of an AI agent. The agent will continue its task from your summary alone: "
    "everything you leave out is lost to it."
)
DEFAULT_HARNESS_PROMPT = (
    "Here is the agent's transcript so far.\n\n{transcript}\n\nWrite the agent's working summary.\n"
    "Goal: the task, with every item or input it names.\n"
    "Facts: every result the tools returned, copied exactly (names and numbers), one per line.\n"
    "Remaining: what the task still needs that the facts do not give.\n"
    "Be brief; do not call a tool; do not answer the task yourself."
)
SUMMARIES_KEY = "summaries"
DEFAULT_SUMMARY_PROMPT = (
    "Your context is almost full and will be cleared. Write a summary that lets you continue the task from it "
    "alone, under these headings:\nGoal: what the task asks.\nDone: what you did and found (files, results).\n"
    "Open items: what is still wrong or unknown.\nPlan: your next steps.\nDo not call a tool in this message."
)
DEFAULT_CONTINUATION = (
    "Your earlier context was cleared. This is a summary of your work so far:\n\n{summary}\n\n"
    "Continue the task from here."
)
_TOOL_CALL_RE = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.S)


@dataclass
class SummaryConfig:
    """When and how an episode compacts its context by summarising itself."""

    trigger_tokens: int
    """Compact when the model's view holds at least this many tokens after a turn."""
    prompt: str = DEFAULT_SUMMARY_PROMPT
    """The request for a summary, appended as a forced user message (goal, done, open items, plan)."""
    max_summary_tokens: int = 512
    """Most tokens sampled for one summary."""
    continuation: str = DEFAULT_CONTINUATION
    """The user message that carries the summary into the new view; ``{summary}`` is replaced by it."""
    max_compactions: int = 8
    """Most compactions per episode; past it the episode runs on until its token budget ends it."""
    mode: str = "self"
    """Who writes the summary: self (the agent, trainable tokens), prompted (the same policy answering
    ``harness_prompt`` over the transcript, outside the episode) or state_dump (the harness lists the tool calls
    and results so far)."""
    harness_prompt: str = DEFAULT_HARNESS_PROMPT
    """mode=prompted: the summarisation request; ``{transcript}`` is replaced by the view as plain text."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"SummaryConfig.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if "{transcript}" not in self.harness_prompt:
            raise ValueError("SummaryConfig.harness_prompt must contain '{transcript}'")
        if self.trigger_tokens < 1:
            raise ValueError(f"SummaryConfig.trigger_tokens must be >= 1, got {self.trigger_tokens}")
        if self.max_summary_tokens < 1:
            raise ValueError(f"SummaryConfig.max_summary_tokens must be >= 1, got {self.max_summary_tokens}")
        if self.max_compactions < 1:
            raise ValueError(f"SummaryConfig.max_compactions must be >= 1, got {self.max_compactions}")
        if not self.prompt.strip():
            raise ValueError("SummaryConfig.prompt must not be empty")
        if "{summary}" not in self.continuation:
            raise ValueError("SummaryConfig.continuation must contain '{summary}'")


def is_due(config: SummaryConfig, view_tokens: int, compactions: int) -> bool:
    return view_tokens >= config.trigger_tokens and compactions < config.max_compactions


def summary_request(config: SummaryConfig) -> Message:
    return Message("user", config.prompt)


def is_summary_request(messages: list[Message], config: SummaryConfig | None = None) -> bool:
    """Whether the last message asks for a summary (for scripted rules that must answer it)."""
    prompt = (config.prompt if config else DEFAULT_SUMMARY_PROMPT).strip()
    return bool(messages) and messages[-1].role == "user" and messages[-1].content.strip() == prompt


def summary_text(completion_text: str) -> str:
    """The summary the model wrote: its text without any tool call it made anyway."""
    return _TOOL_CALL_RE.sub("", completion_text).strip()


def compacted_view(opening: list[Message], summary: str, config: SummaryConfig) -> list[Message]:
    """The new view: the episode's opening messages (system prompt + task) and the summary."""
    return [*opening, Message("user", config.continuation.format(summary=summary))]


def render_transcript(messages: list[Message]) -> str:
    """The view as plain text for a harness summariser: one line per message, tool calls written out."""
    lines = []
    for m in messages:
        calls = "".join(f" [calls {c.name}({_args(c.arguments)})]" for c in m.tool_calls)
        who = f"TOOL {m.name}" if m.role == "tool" and m.name else m.role.upper()
        lines.append(f"{who}: {m.content.strip()}{calls}".rstrip())
    return "\n".join(lines)


def state_dump(messages: list[Message]) -> str:
    """Every tool call so far and its result, in order (the harness's deterministic summary)."""
    results = {m.tool_call_id: m for m in messages if m.role == "tool"}
    lines = []
    for m in messages:
        for c in m.tool_calls:
            reply = results.get(c.id)
            got = (("error: " if reply.is_error else "") + reply.content.strip()) if reply else "(no result)"
            lines.append(f"{len(lines) + 1}. {c.name}({_args(c.arguments)}) -> {got}")
    return "Tool calls so far and their results:\n" + ("\n".join(lines) if lines else "(none)")


def _args(arguments: Any) -> str:
    if isinstance(arguments, dict):
        return ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    return str(arguments)


def harness_request(config: SummaryConfig, view: list[Message]) -> list[Message]:
    """mode=prompted: the separate conversation that asks the policy for a summary of ``view``."""
    return [Message("system", HARNESS_SYSTEM),
            Message("user", config.harness_prompt.format(transcript=render_transcript(view)))]  # fmt: skip


def is_harness_request(messages: list[Message]) -> bool:
    """Whether a conversation is a mode=prompted summarisation request (for scripted rules that must answer it)."""
    return bool(messages) and messages[0].role == "system" and messages[0].content == HARNESS_SYSTEM


def record(turn: int, message_index: int, text: str, tokens_before: int, tokens_after: int, *,
           mode: str = "self", summary_tokens: int = 0) -> dict[str, Any]:  # fmt: skip
    """One entry of ``trajectory.info["summaries"]``; ``message_index`` is where the continuation starts in
    ``trajectory.messages`` (what the reward toolkit's summary-usefulness term reads); ``summary_tokens`` is the
    summary's length in tokens (sampled, or for state_dump encoded)."""
    return {
        "turn": turn,
        "message_index": message_index,
        "text": text,
        "tokens_before": tokens_before,
        "tokens_after": tokens_after,
        "mode": mode,
        "summary_tokens": summary_tokens,
    }


def summary_metrics(records: list[dict[str, Any]]) -> dict[str, float]:
    """``compactions``, the mean view size before and after them, and the summaries' tokens (mean per summary
    and total per episode)."""
    out = {"compactions": float(len(records)), "summary_tokens_total": float(sum(r.get("summary_tokens", 0)
                                                                                 for r in records))}  # fmt: skip
    if records:
        out["tokens_before_compaction"] = sum(r["tokens_before"] for r in records) / len(records)
        out["tokens_after_compaction"] = sum(r["tokens_after"] for r in records) / len(records)
        out["summary_tokens"] = out["summary_tokens_total"] / len(records)
    return out


def from_value(value: SummaryConfig | dict[str, Any] | None, field: str) -> SummaryConfig | None:
    """A config field's summary setting (None or {} = off, a table of SummaryConfig fields, or a SummaryConfig)
    as a SummaryConfig; a bad table fails naming ``field`` and the bad key or value."""
    if value is None or isinstance(value, SummaryConfig):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a table of SummaryConfig fields, got {value!r}")
    if not value:
        return None
    known = set(SummaryConfig.__dataclass_fields__)
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{field}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if "trigger_tokens" not in value:
        raise ValueError(f"{field} needs trigger_tokens (the view size that starts a compaction)")
    try:
        return SummaryConfig(**value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{field}: {e}") from None
