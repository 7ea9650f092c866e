"""The monitor registry (``MONITORS``) and ``Monitors``, which runs them over a batch and raises alerts.

A monitor that cannot apply to the env at all (``MonitorSpec.needs``: the exploration and tool-use monitors on
an env without tools, early termination where every episode is one turn) says so once (a warning), is listed in
``Monitors.not_applicable``, and stays silent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from taskrl.monitors import checks, swarm
from taskrl.monitors.config import THRESHOLDS, Alert, MonitorConfig
from taskrl.monitors.episode import EPS
from taskrl.types import Trajectory

log = logging.getLogger("taskrl.monitor")

MonitorFn = Callable[[Sequence[Trajectory], MonitorConfig, "frozenset[str] | None"], "float | None"]


@dataclass(frozen=True)
class MonitorSpec:
    """One monitor: its function and which side is bad (its threshold: ``MonitorConfig.threshold(name)``)."""

    fn: MonitorFn
    bad_when_above: bool
    meaning: str
    needs: str = ""
    """What the env must have for the metric to mean anything: "tools" (at least one tool), "turns" (episodes can
    run past ``MonitorConfig.early_turns``: the env has tools and ``max_turns`` allows it), or "" (any env)."""
    peak_ratio: str = ""
    """A ``MonitorConfig`` field: also bad below that share of the highest value of an earlier batch (a collapse)."""


def not_applicable_reason(
    spec: MonitorSpec, tool_names: frozenset[str] | None, *, max_turns: int | None = None, early_turns: int = 1
) -> str | None:
    """Why ``spec`` can never apply to an env with these tools (and episodes of at most ``max_turns`` turns); None
    when it may (or the tools are unknown)."""
    if spec.needs in ("tools", "turns") and tool_names is not None and not tool_names:
        if spec.needs == "turns":
            return "the env has no tools, so every episode ends at its first answer"
        return "the env has no tools, so there are no tool calls to measure"
    if spec.needs == "turns" and max_turns is not None and max_turns <= early_turns:
        return f"episodes have at most {max_turns} turn(s), so every answer comes within the first turns"
    return None


MONITORS: dict[str, MonitorSpec] = {
    "reward_hacking": MonitorSpec(checks.reward_hacking, True, "high-reward episodes fail an independent check"),
    "tool_ngram_entropy": MonitorSpec(checks.tool_ngram_entropy, False,
                                      "exploration collapse: tool sequences have little entropy", needs="tools"),
    "duplicate_rate": MonitorSpec(checks.duplicate_rate, True,
                                  "exploration collapse: samples of a task repeat each other"),
    "context_pollution": MonitorSpec(checks.context_pollution, True, "context is filled with irrelevant chunks"),
    "tool_concentration": MonitorSpec(checks.tool_concentration, True,
                                      "tool over-use: one tool takes almost every call", needs="tools"),
    "calls_per_success": MonitorSpec(checks.calls_per_success, True,
                                     "tool over-use: many calls per solved item", needs="tools"),
    "loop_rate": MonitorSpec(checks.loop_rate, True, "episodes repeat the same call (tool-call loops)", needs="tools"),
    "serial_collapse": MonitorSpec(swarm.serial_collapse, True,
                                   "swarm: never more than one useful sub-agent at a time"),
    "spurious_parallelism": MonitorSpec(swarm.spurious_parallelism, True,
                                        "swarm: sub-agents launched together are wasted (dummies, repeats, padding)"),
    "invalid_call_rate": MonitorSpec(checks.invalid_call_rate, True, "many tool calls are malformed"),
    "early_termination": MonitorSpec(checks.early_termination, True, "episodes give up within the first turns",
                                     needs="turns"),
    "clarifying_rate": MonitorSpec(checks.clarifying_rate, True, "episodes ask the user a question instead of working"),
    "no_edit_rate": MonitorSpec(checks.no_edit_rate, True, "episodes end without editing anything"),
    "tool_calls_per_episode": MonitorSpec(checks.tool_calls_per_episode, False,
                                          "tool-call collapse: episodes stopped making tool calls (check the parser "
                                          "matches the model's format)", needs="tools",
                                          peak_ratio="tool_call_collapse_ratio"),
    "unparsed_tool_calls": MonitorSpec(checks.unparsed_tool_calls, True,
                                       "turns that look like tool calls parse as none (parser/format mismatch)",
                                       needs="tools"),
    "capped_success": MonitorSpec(checks.capped_success, True,
                                  "successes lean on the token cap: their turns never end by themselves (give "
                                  "max_new_tokens room; overlong_filter alone may not stop it)"),
}  # fmt: skip


class Monitors:
    """Runs every enabled monitor over a batch; call ``check`` once per training step or evaluation.

    ``tool_names`` (the env's tools, e.g. ``env.tools.names``) lets tool-dependent monitors know what exists:
    concentration is not judged for one-tool envs, no-edit applies as soon as the env has an edit tool, and an env
    without tools gets no exploration or tool-use monitors at all (said once, then silent).
    """

    def __init__(
        self,
        config: MonitorConfig | None = None,
        *,
        tool_names: Iterable[str] | None = None,
        max_turns: int | None = None,
        log_alerts: bool = True,
    ) -> None:
        self.config = config or MonitorConfig()
        self.tool_names = frozenset(tool_names) if tool_names is not None else None
        self.log_alerts = log_alerts
        """Log each alert as a warning (off where alerts are shown otherwise, e.g. in the report)."""
        self.active: set[str] = set()
        """Monitors whose last check alerted (mitigations such as the temperature floor may key on them)."""
        self.not_applicable: dict[str, str] = {}
        """Monitor -> why it can never apply to this env; those monitors are skipped (logged once, on first check)."""
        for name, spec in MONITORS.items():
            reason = not_applicable_reason(spec, self.tool_names, max_turns=max_turns,
                                           early_turns=self.config.early_turns)  # fmt: skip
            if reason is not None and name not in self.config.disabled:
                self.not_applicable[name] = reason
        self._told = False
        self.peaks: dict[str, float] = {}
        """Highest value of each ``peak_ratio`` monitor over the batches checked so far."""

    def check(self, step: int, trajectories: Sequence[Trajectory]) -> tuple[dict[str, float], list[Alert]]:
        """``monitor/<name>`` values of this batch, and the alerts they raise (also logged as warnings)."""
        cfg = self.config
        metrics: dict[str, float] = {}
        alerts: list[Alert] = []
        if not self._told and self.not_applicable:
            self._told = True
            by_reason: dict[str, list[str]] = {}
            for name, reason in self.not_applicable.items():
                by_reason.setdefault(reason, []).append(name)
            for reason, names in by_reason.items():
                log.warning("monitors %s do not apply to this env (%s); they stay silent", ", ".join(names), reason)
        if len(trajectories) < cfg.min_episodes:
            return metrics, alerts
        for name, spec in MONITORS.items():
            if name in cfg.disabled or name in self.not_applicable:
                continue
            value = spec.fn(trajectories, cfg, self.tool_names)
            if value is None:
                continue
            metrics[f"monitor/{name}"] = float(value)
            threshold = cfg.threshold(name)
            if spec.peak_ratio:
                peak = self.peaks.get(name)
                threshold = max(threshold, float(getattr(cfg, spec.peak_ratio)) * peak if peak else 0.0)
                self.peaks[name] = max(peak or 0.0, float(value))
            if (value > threshold + EPS) if spec.bad_when_above else (value < threshold - EPS):
                side = ">" if spec.bad_when_above else "<"
                message = f"{spec.meaning}: {name} = {value:.3g} {side} {threshold:g} ({THRESHOLDS[name]})"
                alerts.append(Alert(int(step), name, float(value), threshold, message))
                if self.log_alerts:
                    log.warning("step %d: %s", step, message)
        self.active = {a.monitor for a in alerts}
        return metrics, alerts
