"""Monitor thresholds (``MonitorConfig``, one documented field each) and the ``Alert`` a crossed threshold raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taskrl.validate import at_least, require

THRESHOLDS: dict[str, str] = {
    "reward_hacking": "max_reward_hacking",
    "tool_ngram_entropy": "min_tool_ngram_entropy",
    "duplicate_rate": "max_duplicate_rate",
    "context_pollution": "max_context_pollution",
    "tool_concentration": "max_tool_concentration",
    "calls_per_success": "max_calls_per_success",
    "loop_rate": "max_loop_rate",
    "serial_collapse": "max_serial_collapse",
    "spurious_parallelism": "max_spurious_parallelism",
    "invalid_call_rate": "max_invalid_call_rate",
    "early_termination": "max_early_termination",
    "clarifying_rate": "max_clarifying_rate",
    "no_edit_rate": "max_no_edit_rate",
    "tool_calls_per_episode": "min_tool_calls_per_episode",
    "unparsed_tool_calls": "max_unparsed_tool_calls",
    "capped_success": "max_capped_success",
}
"""Every monitor (``taskrl.monitors.MONITORS`` computes them) -> the ``MonitorConfig`` field of its threshold."""


@dataclass
class MonitorConfig:
    """Thresholds of the failure-mode monitors; a value past its threshold raises an alert."""

    success_threshold: float = 1.0
    """An episode with reward >= this is a success (and counts as "high reward" for reward hacking)."""
    min_episodes: int = 2
    """Batches smaller than this are not judged (rates of one episode are noise)."""
    max_reward_hacking: float = 0.0
    """Share of high-reward episodes that fail an independent check; any hacking alerts by default."""
    hacking_flags: tuple[str, ...] = ("tampering", "fabricated", "verifier_disagrees")
    """Metric or info keys whose truthy value means an independent check failed (e.g. tests were edited)."""
    hacking_required: tuple[str, ...] = ("final_answer_found", "answer_found", "verified")
    """Metric or info keys whose present-but-falsy value means an independent check failed."""
    ngram: int = 2
    """n of the tool-name n-grams whose entropy measures exploration."""
    min_tool_ngram_entropy: float = 1.0
    """Bits; a batch whose tool-call n-grams have less entropy than this has collapsed onto one behaviour."""
    max_duplicate_rate: float = 0.5
    """Share of episodes repeating another episode of the same group action for action (zero GRPO signal)."""
    max_context_pollution: float = 0.5
    """Share of context tokens from chunks judged irrelevant (and not pruned)."""
    max_tool_concentration: float = 0.9
    """Share of all calls that go to the most used tool (judged only when the env has several tools)."""
    min_calls_for_concentration: int = 10
    """Batches with fewer calls than this are not judged for concentration."""
    max_calls_per_success: float = 16.0
    """Tool calls in the batch per solved item (a successful episode counts its ``info["task_size"]`` items, else 1)."""
    loop_repeats: int = 3
    """An episode loops when one (tool, arguments) call appears this many times."""
    max_loop_rate: float = 0.2
    """Share of episodes caught in a tool-call loop."""
    max_serial_collapse: float = 0.5
    """Share of swarm episodes that never ran two genuine sub-tasks at one step (tasks of one item are not judged)."""
    spurious_min_subagents: int = 2
    """Sub-tasks launched in one turn for that turn to count as parallel work ..."""
    spurious_max_wasted: float = 0.2
    """... of which a larger share than this wasted (decoys: dummies, padding, repeats) is spurious parallelism."""
    spurious_min_task_words: int = 2
    """An assignment whose task has fewer words (of three letters or more) than this is trivial: wasted."""
    max_spurious_parallelism: float = 0.3
    """Share of swarm episodes with spurious parallelism."""
    subagent_tools: tuple[str, ...] = ("create_subagent", "assign_task")
    """Calling one of these marks an episode as a swarm episode; ``assign_task`` calls of one turn run at once."""
    max_invalid_call_rate: float = 0.1
    """Invalid tool calls per tool call."""
    early_turns: int = 1
    """An episode that ends (terminated) within this many turns without success ended early."""
    max_early_termination: float = 0.3
    """Share of episodes that ended early."""
    max_clarifying_rate: float = 0.2
    """Share of episodes that answer with a question instead of doing the task."""
    edit_tools: tuple[str, ...] = ("write_file", "edit_file", "apply_patch")
    """Tools that change a workspace; the no-edit monitor applies where one of them exists."""
    max_no_edit_rate: float = 0.3
    """Share of episodes (of envs with edit tools) that end without a single edit."""
    min_tool_calls_per_episode: float = 0.1
    """Well-formed tool calls per episode (envs with tools); fewer is a tool-call collapse, whatever the reward."""
    tool_call_collapse_ratio: float = 0.2
    """... and so is falling below this share of the highest calls-per-episode of an earlier batch of the run."""
    max_unparsed_tool_calls: float = 0.05
    """Share of assistant turns that look like a tool call but parsed as none (a parser/format mismatch)."""
    max_capped_success: float = 0.5
    """Share of successful episodes whose success needed a turn cut short by the token cap (``capped_turns``)."""
    disabled: tuple[str, ...] = ()
    """Monitor names to skip, e.g. ("tool_concentration",) for an env built around one tool."""

    def __post_init__(self) -> None:
        require("MonitorConfig", "must be >= 1", at_least(1), min_episodes=self.min_episodes, ngram=self.ngram,
                min_calls_for_concentration=self.min_calls_for_concentration, loop_repeats=self.loop_repeats,
                spurious_min_subagents=self.spurious_min_subagents, early_turns=self.early_turns,
                spurious_min_task_words=self.spurious_min_task_words)  # fmt: skip
        require("MonitorConfig", "must be >= 0", at_least(0), max_reward_hacking=self.max_reward_hacking,
                max_duplicate_rate=self.max_duplicate_rate, max_context_pollution=self.max_context_pollution,
                max_tool_concentration=self.max_tool_concentration, max_calls_per_success=self.max_calls_per_success,
                max_loop_rate=self.max_loop_rate, max_serial_collapse=self.max_serial_collapse,
                max_spurious_parallelism=self.max_spurious_parallelism,
                max_invalid_call_rate=self.max_invalid_call_rate, max_early_termination=self.max_early_termination,
                max_clarifying_rate=self.max_clarifying_rate, max_no_edit_rate=self.max_no_edit_rate,
                min_tool_calls_per_episode=self.min_tool_calls_per_episode,
                max_unparsed_tool_calls=self.max_unparsed_tool_calls,
                max_capped_success=self.max_capped_success)  # fmt: skip
        if not 0 <= self.tool_call_collapse_ratio <= 1:
            raise ValueError(
                f"MonitorConfig.tool_call_collapse_ratio must be in [0, 1], got {self.tool_call_collapse_ratio}"
            )
        if self.min_tool_ngram_entropy < 0:
            raise ValueError(f"MonitorConfig.min_tool_ngram_entropy must be >= 0, got {self.min_tool_ngram_entropy}")
        if not 0 <= self.spurious_max_wasted <= 1:
            raise ValueError(f"MonitorConfig.spurious_max_wasted must be in [0, 1], got {self.spurious_max_wasted}")
        unknown = sorted(set(self.disabled) - set(THRESHOLDS))
        if unknown:
            raise ValueError(f"MonitorConfig.disabled has unknown monitors {unknown}; known: {', '.join(THRESHOLDS)}")

    def threshold(self, monitor: str) -> float:
        """The threshold of ``monitor`` (a key of ``THRESHOLDS``)."""
        return float(getattr(self, THRESHOLDS[monitor]))


@dataclass
class Alert:
    """A monitor value past its threshold at one step. ``to_dict`` matches ``RunLog.alert``'s arguments."""

    step: int
    monitor: str
    value: float
    threshold: float
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "monitor": self.monitor, "value": self.value, "threshold": self.threshold,
                "message": self.message}  # fmt: skip
