"""Self-summarization (Composer): compact the context at a token trigger and continue from a summary.

Set ``RolloutConfig(summary=SummaryConfig(trigger_tokens=...))``. When the model's view reaches the trigger
after a turn, the agent loop appends ``SummaryConfig.prompt`` as a forced user message, samples the summary
(trainable tokens in the current segment, sharing the episode's reward like every segment), and replaces the
view with the episode's opening messages (system prompt + task) plus the summary; the next turn opens a new
Segment. Each compaction is recorded in ``trajectory.info["summaries"]``; metrics say how many and how much
they saved. This module holds the prompts, the new view and the bookkeeping; ``rollout.py`` runs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from taskrl.types import Message

SUMMARIES_KEY = "summaries"
DEFAULT_SUMMARY_PROMPT = (
    "Your context is almost full and will be cleared. Write a summary that lets you continue the task from it "
    "alone, under these headings:\nGoal: what the task asks.\nDone: what you did and found (files, results).\n"
    "Open items: what is still wrong or unknown.\nPlan: your next steps.\nDo not call a tool in this message."
)
DEFAULT_CONTINUATION = (
    "Your earlier context was cleared. This is the summary you wrote of your work so far:\n\n{summary}\n\n"
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

    def __post_init__(self) -> None:
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


def record(turn: int, message_index: int, text: str, tokens_before: int, tokens_after: int) -> dict[str, Any]:
    """One entry of ``trajectory.info["summaries"]``; ``message_index`` is where the continuation starts in
    ``trajectory.messages`` (what the reward toolkit's summary-usefulness term reads)."""
    return {
        "turn": turn,
        "message_index": message_index,
        "text": text,
        "tokens_before": tokens_before,
        "tokens_after": tokens_after,
    }


def summary_metrics(records: list[dict[str, Any]]) -> dict[str, float]:
    """``compactions``, and the mean view size before and after them."""
    out = {"compactions": float(len(records))}
    if records:
        out["tokens_before_compaction"] = sum(r["tokens_before"] for r in records) / len(records)
        out["tokens_after_compaction"] = sum(r["tokens_after"] for r in records) / len(records)
    return out
