"""Failure-mode monitors over a batch of trajectories, and the mitigations a trainer can switch on.

``Monitors(MonitorConfig()).check(step, trajectories) -> (metrics, alerts)`` computes ``monitor/<name>`` values
(reward hacking, exploration collapse, context pollution, tool over-use, tool-call loops, swarm serial collapse and
spurious parallelism, invalid calls, early termination, clarifying questions, no-edit episodes, tool-call collapse,
unparsed tool calls and successes that lean on the token cap) and raises an
``Alert`` (also a logged warning) when one crosses its threshold. ``shape_rewards`` adds the reward-shaping
mitigations; the trajectory keys the monitors read are listed in docs/design/monitors-and-eval.md and
docs/design/swarm.md.
Modules: ``config`` (thresholds, Alert), ``episode`` (per-trajectory readings), ``checks`` and ``swarm`` (the
monitors), ``runner`` (registry, ``Monitors``), ``mitigations``. ``taskrl.monitor`` re-exports all of it.
"""

from taskrl.monitors.checks import (
    calls_per_success,
    capped_success,
    clarifying_rate,
    context_pollution,
    duplicate_rate,
    early_termination,
    invalid_call_rate,
    loop_rate,
    no_edit_rate,
    reward_hacking,
    tool_calls_per_episode,
    tool_concentration,
    tool_ngram_entropy,
    unparsed_tool_calls,
)
from taskrl.monitors.config import THRESHOLDS, Alert, MonitorConfig
from taskrl.monitors.episode import (
    FAILED_CHECKS_KEY,
    child_spans,
    failed_checks,
    is_question,
    is_success,
    max_concurrency,
    tool_calls,
)
from taskrl.monitors.mitigations import (
    EXPLORATION_MONITORS,
    FirstToolHint,
    MitigationConfig,
    least_used_first_tool,
    sampling_temperature,
    shape_rewards,
    with_first_tool_hints,
)
from taskrl.monitors.runner import MONITORS, MonitorFn, Monitors, MonitorSpec, not_applicable_reason
from taskrl.monitors.swarm import serial_collapse, spurious_parallelism

__all__ = [
    "EXPLORATION_MONITORS", "FAILED_CHECKS_KEY", "MONITORS", "THRESHOLDS", "Alert", "FirstToolHint", "MitigationConfig",
    "MonitorConfig", "MonitorFn", "MonitorSpec", "Monitors", "calls_per_success", "capped_success", "child_spans",
    "clarifying_rate", "context_pollution", "duplicate_rate", "early_termination", "failed_checks", "invalid_call_rate",
    "is_question", "is_success", "least_used_first_tool", "loop_rate", "max_concurrency", "no_edit_rate",
    "not_applicable_reason", "reward_hacking", "sampling_temperature", "serial_collapse", "shape_rewards",
    "spurious_parallelism", "tool_calls", "tool_calls_per_episode", "tool_concentration", "tool_ngram_entropy",
    "unparsed_tool_calls", "with_first_tool_hints",
]  # fmt: skip
