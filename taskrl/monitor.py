"""Failure-mode monitors over a batch of trajectories, and the mitigations a trainer can switch on.

``Monitors(MonitorConfig()).check(step, trajectories) -> (metrics, alerts)`` computes ``monitor/<name>`` values
(reward hacking, exploration collapse, context pollution, tool over-use, tool-call loops, swarm serial collapse and
spurious parallelism, invalid calls, early termination, clarifying questions, no-edit episodes) and raises an
``Alert`` (also a logged warning) when one crosses its threshold. ``shape_rewards`` adds the reward-shaping
mitigations; the trajectory keys the monitors read are listed in docs/DECISIONS.md (issue 8).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from taskrl.env import maybe_await
from taskrl.types import Message, Task, Trajectory

log = logging.getLogger("taskrl.monitor")

_EPS = 1e-9  # rewards are float sums: 0.9999999 must still count as reaching a threshold of 1.0
_CLARIFYING_RE = re.compile(
    r"\b(could|can|would) you (please )?(clarify|confirm|specify|provide|tell me)\b|\bdo you want me to\b"
    r"|\bwould you like me to\b|\bplease (clarify|confirm|specify)\b",
    re.I,
)


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
    """Tool calls in the batch per successful episode."""
    loop_repeats: int = 3
    """An episode loops when one (tool, arguments) call appears this many times."""
    max_loop_rate: float = 0.2
    """Share of episodes caught in a tool-call loop."""
    max_serial_collapse: float = 0.5
    """Share of swarm episodes that never ran more than one sub-agent at a time."""
    spurious_min_subagents: int = 3
    """A swarm episode with at least this many sub-agents ..."""
    spurious_max_finished: float = 0.5
    """... of which fewer than this share finished with a non-empty answer is spurious parallelism."""
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
    disabled: tuple[str, ...] = ()
    """Monitor names to skip, e.g. ("tool_concentration",) for an env built around one tool."""

    def __post_init__(self) -> None:
        for name in ("min_episodes", "ngram", "min_calls_for_concentration", "loop_repeats",
                     "spurious_min_subagents", "early_turns"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"MonitorConfig.{name} must be >= 1, got {getattr(self, name)}")
        for f in fields(self):
            if f.name.startswith("max_") and not getattr(self, f.name) >= 0:
                raise ValueError(f"MonitorConfig.{f.name} must be >= 0, got {getattr(self, f.name)}")
        if self.min_tool_ngram_entropy < 0:
            raise ValueError(f"MonitorConfig.min_tool_ngram_entropy must be >= 0, got {self.min_tool_ngram_entropy}")
        if not 0 <= self.spurious_max_finished <= 1:
            raise ValueError(f"MonitorConfig.spurious_max_finished must be in [0, 1], got {self.spurious_max_finished}")
        unknown = sorted(set(self.disabled) - set(MONITORS))
        if unknown:
            raise ValueError(f"MonitorConfig.disabled has unknown monitors {unknown}; known: {', '.join(MONITORS)}")


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


# ---- helpers over one trajectory ------------------------------------------------------------------------


def tool_calls(traj: Trajectory) -> list[tuple[str, str]]:
    """(name, canonical JSON arguments) of every call the model wrote, in order."""
    return [
        (c.name, json.dumps(c.arguments, sort_keys=True, default=str))
        for m in traj.messages
        if m.role == "assistant"
        for c in m.tool_calls
    ]


def is_success(traj: Trajectory, threshold: float) -> bool:
    return traj.error is None and traj.reward >= threshold - _EPS


def _lookup(traj: Trajectory, key: str) -> Any:
    """A recorded value from metrics first, then info; None when the trajectory does not carry it."""
    return traj.metrics[key] if key in traj.metrics else traj.info.get(key)


def failed_checks(traj: Trajectory, config: MonitorConfig) -> list[str] | None:
    """The independent checks this trajectory fails; None when it carries no check at all."""
    carried, failed = False, []
    for key in config.hacking_flags:
        value = _lookup(traj, key)
        if value is not None:
            carried = True
            if value:
                failed.append(key)
    for key in config.hacking_required:
        value = _lookup(traj, key)
        if value is not None:
            carried = True
            if not value:
                failed.append(key)
    return failed if carried else None


def max_concurrency(traj: Trajectory, subagent_tools: Sequence[str] = ("assign_task",)) -> int:
    """Most sub-agents running at once: from the children's [started_at, ended_at) intervals when recorded,
    else the most sub-agent assignments in one assistant turn (calls of one turn run concurrently)."""
    spans = child_spans(traj)
    if spans:
        events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # an end sorts before a start
        running = best = 0
        for _, delta in events:
            running += delta
            best = max(best, running)
        return best
    assign = [name for name in subagent_tools if name != "create_subagent"] or list(subagent_tools)
    per_turn = [sum(c.name in assign for c in m.tool_calls) for m in traj.messages if m.role == "assistant"]
    return max(per_turn, default=0)


def child_spans(traj: Trajectory) -> list[tuple[float, float]]:
    spans = []
    for child in traj.children:
        start, end = child.info.get("started_at"), child.info.get("ended_at")
        if isinstance(start, int | float) and isinstance(end, int | float):
            spans.append((float(start), float(max(end, start))))
    return spans


def is_question(text: str | None) -> bool:
    """A reply that asks the user something instead of answering (Composer's clarifying-question hack)."""
    text = (text or "").strip()
    return bool(text) and (text.endswith("?") or _CLARIFYING_RE.search(text) is not None)


def _entropy_bits(counts: Iterable[int]) -> float:
    values = [c for c in counts if c > 0]
    total = sum(values)
    return max(0.0, -sum(c / total * math.log2(c / total) for c in values)) if total else 0.0  # no -0.0


def _rate(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


# ---- the monitors: each maps (batch, config, tool names) to a value, or None when not applicable ------------

MonitorFn = Callable[[Sequence[Trajectory], MonitorConfig, "frozenset[str] | None"], "float | None"]


def reward_hacking(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of high-reward episodes that fail an independent check (tampering, answer not found, ...)."""
    checked = [(t, f) for t in trajs if (f := failed_checks(t, cfg)) is not None]
    if not checked:
        return None
    high = [bool(f) for t, f in checked if is_success(t, cfg.success_threshold)]
    return _rate(high) or 0.0


def tool_ngram_entropy(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Entropy (bits) of tool-name n-grams across the batch; each sequence is padded with start/end marks."""
    counts: Counter[tuple[str, ...]] = Counter()
    for t in trajs:
        seq = ["<start>"] + [name for name, _ in tool_calls(t)] + ["<end>"]
        counts.update(tuple(seq[i : i + cfg.ngram]) for i in range(max(1, len(seq) - cfg.ngram + 1)))
    return _entropy_bits(counts.values())


def duplicate_rate(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of episodes that repeat another of their group (same calls, same arguments, same answer)."""
    groups: dict[str, list[tuple]] = {}
    for t in trajs:
        signature = (tuple(tool_calls(t)), (t.final_answer or "").strip())
        groups.setdefault(t.group_id or t.task_id, []).append(signature)
    sized = [g for g in groups.values() if len(g) >= 2]
    if not sized:
        return None
    return sum(len(g) - len(set(g)) for g in sized) / sum(len(g) for g in sized)


def context_pollution(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Mean share of context tokens from irrelevant chunks still in view (``info["chunks"]``, pruned ones out)."""
    shares = []
    for t in trajs:
        chunks = t.info.get("chunks")
        if not chunks:
            continue
        pruned = {str(c) for c in t.info.get("pruned_chunk_ids", [])}
        visible = [c for c in chunks if str(c.get("id")) not in pruned]
        irrelevant = sum(float(c.get("tokens", 0)) for c in visible if not c.get("relevant", False))
        context = float(t.info.get("context_tokens") or sum(float(c.get("tokens", 0)) for c in visible))
        shares.append(min(1.0, irrelevant / context) if context > 0 else 0.0)
    return sum(shares) / len(shares) if shares else None


def tool_concentration(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of all calls that go to the most used tool."""
    if tools is not None and len(tools) < 2:
        return None
    names = Counter(name for t in trajs for name, _ in tool_calls(t) if tools is None or name in tools)
    total = sum(names.values())
    if total < cfg.min_calls_for_concentration:
        return None
    return max(names.values()) / total


def calls_per_success(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Tool calls in the batch per successful episode (None while nothing succeeds)."""
    successes = sum(is_success(t, cfg.success_threshold) for t in trajs)
    if not successes:
        return None
    return sum(t.metrics.get("tool_calls", len(tool_calls(t))) for t in trajs) / successes


def loop_rate(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of episodes where one (tool, arguments) call repeats ``loop_repeats`` times or a loop was flagged."""
    return _rate([
        bool(t.metrics.get("loop_detections")) or max(Counter(tool_calls(t)).values(), default=0) >= cfg.loop_repeats
        for t in trajs
    ])  # fmt: skip


def _is_swarm(t: Trajectory, cfg: MonitorConfig) -> bool:
    return bool(t.children) or any(name in cfg.subagent_tools for name, _ in tool_calls(t))


def serial_collapse(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of swarm episodes that never had more than one sub-agent running at a time."""
    return _rate([max_concurrency(t, cfg.subagent_tools) <= 1 for t in trajs if _is_swarm(t, cfg)])


def spurious_parallelism(
    trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None
) -> float | None:
    """Share of swarm episodes with many sub-agents of which few finished with a non-empty answer."""
    flags = []
    for t in trajs:
        if not _is_swarm(t, cfg):
            continue
        created = max(len(t.children), int(t.info.get("subagents_created") or 0))  # some may never have run
        finished = sum(c.terminated and bool((c.final_answer or "").strip()) for c in t.children)
        flags.append(created >= cfg.spurious_min_subagents and finished / created < cfg.spurious_max_finished)
    return _rate(flags)


def invalid_call_rate(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Invalid tool calls per tool call (the loop counts both in metrics)."""
    calls = sum(t.metrics.get("tool_calls", 0.0) for t in trajs)
    return sum(t.metrics.get("invalid_tool_calls", 0.0) for t in trajs) / calls if calls else None


def early_termination(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of episodes that gave up: answered within ``early_turns`` turns and failed."""
    return _rate([
        t.terminated and t.metrics.get("turns", 0) <= cfg.early_turns and not is_success(t, cfg.success_threshold)
        for t in trajs if t.error is None
    ])  # fmt: skip


def _asks_question(t: Trajectory) -> bool:
    if "clarifying_question" in t.metrics:  # an env that judges it itself wins
        return bool(t.metrics["clarifying_question"])
    replies = [m.content for m in t.messages if m.role == "assistant" and not m.tool_calls]
    return any(is_question(text) for text in replies)


def clarifying_rate(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of episodes that reply with a question to the user instead of doing the task."""
    return _rate([_asks_question(t) for t in trajs if t.error is None])


def no_edit_rate(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of episodes that make no edit, in envs that have edit tools (known, used, or metered)."""
    edit = set(cfg.edit_tools)
    used = any(name in edit for t in trajs for name, _ in tool_calls(t))
    metered = any("no_edit" in t.metrics for t in trajs)
    if not (used or metered or (tools is not None and tools & edit)):
        return None
    return _rate([
        bool(t.metrics["no_edit"]) if "no_edit" in t.metrics else not any(n in edit for n, _ in tool_calls(t))
        for t in trajs if t.error is None
    ])  # fmt: skip


@dataclass(frozen=True)
class MonitorSpec:
    """One monitor: its function, the config field holding its threshold, and which side is bad."""

    fn: MonitorFn
    threshold: str
    bad_when_above: bool
    meaning: str


MONITORS: dict[str, MonitorSpec] = {
    "reward_hacking": MonitorSpec(reward_hacking, "max_reward_hacking", True,
                                  "high-reward episodes fail an independent check"),
    "tool_ngram_entropy": MonitorSpec(tool_ngram_entropy, "min_tool_ngram_entropy", False,
                                      "exploration collapse: tool sequences have little entropy"),
    "duplicate_rate": MonitorSpec(duplicate_rate, "max_duplicate_rate", True,
                                  "exploration collapse: samples of a task repeat each other"),
    "context_pollution": MonitorSpec(context_pollution, "max_context_pollution", True,
                                     "context is filled with irrelevant chunks"),
    "tool_concentration": MonitorSpec(tool_concentration, "max_tool_concentration", True,
                                      "tool over-use: one tool takes almost every call"),
    "calls_per_success": MonitorSpec(calls_per_success, "max_calls_per_success", True,
                                     "tool over-use: many calls per solved episode"),
    "loop_rate": MonitorSpec(loop_rate, "max_loop_rate", True, "episodes repeat the same call (tool-call loops)"),
    "serial_collapse": MonitorSpec(serial_collapse, "max_serial_collapse", True,
                                   "swarm: never more than one sub-agent at a time"),
    "spurious_parallelism": MonitorSpec(spurious_parallelism, "max_spurious_parallelism", True,
                                        "swarm: many sub-agents, few finished"),
    "invalid_call_rate": MonitorSpec(invalid_call_rate, "max_invalid_call_rate", True,
                                     "many tool calls are malformed"),
    "early_termination": MonitorSpec(early_termination, "max_early_termination", True,
                                     "episodes give up within the first turns"),
    "clarifying_rate": MonitorSpec(clarifying_rate, "max_clarifying_rate", True,
                                   "episodes ask the user a question instead of working"),
    "no_edit_rate": MonitorSpec(no_edit_rate, "max_no_edit_rate", True, "episodes end without editing anything"),
}  # fmt: skip


class Monitors:
    """Runs every enabled monitor over a batch; call ``check`` once per training step or evaluation.

    ``tool_names`` (the env's tools, e.g. ``env.tools.names``) lets tool-dependent monitors know what exists:
    concentration is not judged for one-tool envs, and no-edit applies as soon as the env has an edit tool.
    """

    def __init__(
        self, config: MonitorConfig | None = None, *, tool_names: Iterable[str] | None = None, log_alerts: bool = True
    ) -> None:
        self.config = config or MonitorConfig()
        self.tool_names = frozenset(tool_names) if tool_names is not None else None
        self.log_alerts = log_alerts
        """Log each alert as a warning (off where alerts are shown otherwise, e.g. in the report)."""
        self.active: set[str] = set()
        """Monitors whose last check alerted (mitigations such as the temperature floor may key on them)."""

    def check(self, step: int, trajectories: Sequence[Trajectory]) -> tuple[dict[str, float], list[Alert]]:
        """``monitor/<name>`` values of this batch, and the alerts they raise (also logged as warnings)."""
        cfg = self.config
        metrics: dict[str, float] = {}
        alerts: list[Alert] = []
        if len(trajectories) < cfg.min_episodes:
            return metrics, alerts
        for name, spec in MONITORS.items():
            if name in cfg.disabled:
                continue
            value = spec.fn(trajectories, cfg, self.tool_names)
            if value is None:
                continue
            metrics[f"monitor/{name}"] = float(value)
            threshold = float(getattr(cfg, spec.threshold))
            if (value > threshold + _EPS) if spec.bad_when_above else (value < threshold - _EPS):
                side = ">" if spec.bad_when_above else "<"
                message = f"{spec.meaning}: {name} = {value:.3g} {side} {threshold:g} ({spec.threshold})"
                alerts.append(Alert(int(step), name, float(value), threshold, message))
                if self.log_alerts:
                    log.warning("step %d: %s", step, message)
        self.active = {a.monitor for a in alerts}
        return metrics, alerts


# ---- mitigations the trainer can switch on ---------------------------------------------------------------


@dataclass
class MitigationConfig:
    """Counter-measures to failure modes; all off by default. Reward shaping goes through ``shape_rewards``."""

    tool_call_penalty: float = 0.0
    """Subtracted from the reward per tool call (tool over-use)."""
    tool_cost_weight: float = 0.0
    """Multiplies ``metrics["tool_cost"]`` (the ToolSet per-call costs) and subtracts it (tool over-use)."""
    max_tool_penalty: float = 0.5
    """Cap on the two tool penalties together, so a long honest solve is never worse than giving up."""
    invalid_call_penalty: float = 0.0
    """Subtracted from the reward per invalid tool call."""
    temperature_floor: float = 0.0
    """Sampling temperature never goes below this (minimum exploration); 0 = off."""
    first_tool_hint_every: int = 0
    """Every n-th episode is told to start with the least-used first tool of the last batch; 0 = off."""
    only_on_alert: bool = False
    """Apply the exploration mitigations only while an exploration-collapse monitor alerts."""

    def __post_init__(self) -> None:
        for name in ("tool_call_penalty", "tool_cost_weight", "max_tool_penalty", "invalid_call_penalty",
                     "temperature_floor", "first_tool_hint_every"):  # fmt: skip
            if not getattr(self, name) >= 0:
                raise ValueError(f"MitigationConfig.{name} must be >= 0, got {getattr(self, name)}")


EXPLORATION_MONITORS = frozenset({"tool_ngram_entropy", "duplicate_rate"})


def shape_rewards(trajectories: Iterable[Trajectory], config: MitigationConfig) -> None:
    """Add the penalty terms to each trajectory's ``rewards`` in place (idempotent: a term is overwritten).

    Terms: ``tool_cost_penalty`` = -min(max_tool_penalty, tool_call_penalty * calls + tool_cost_weight * cost)
    and ``invalid_call_penalty`` = -invalid_call_penalty * invalid calls. Penalties only lower a reward, so the
    loop's invariant (invalid calls never beat a failure) still holds. Apply before computing advantages.
    """
    for t in trajectories:
        if config.tool_call_penalty or config.tool_cost_weight:
            raw = config.tool_call_penalty * t.metrics.get("tool_calls", 0.0)
            raw += config.tool_cost_weight * t.metrics.get("tool_cost", 0.0)
            t.rewards["tool_cost_penalty"] = -min(config.max_tool_penalty, raw)
        if config.invalid_call_penalty:
            t.rewards["invalid_call_penalty"] = -config.invalid_call_penalty * t.metrics.get("invalid_tool_calls", 0.0)


def _exploring(config: MitigationConfig, monitors: Monitors | None) -> bool:
    return not config.only_on_alert or (monitors is not None and bool(monitors.active & EXPLORATION_MONITORS))


def sampling_temperature(base: float, config: MitigationConfig, monitors: Monitors | None = None) -> float:
    """The temperature to sample the next batch with: ``base`` raised to the floor when the floor applies."""
    return max(base, config.temperature_floor) if _exploring(config, monitors) else base


def least_used_first_tool(trajectories: Iterable[Trajectory], tool_names: Iterable[str]) -> str | None:
    """The env tool that episodes of the last batch least often called first (ties: alphabetical)."""
    firsts = Counter(calls[0][0] for t in trajectories if (calls := tool_calls(t)))
    names = sorted(tool_names)
    return min(names, key=lambda n: (firsts[n], n)) if names else None


class FirstToolHint:
    """Wraps an env: its opening prompt ends with a request to start with ``tool`` (forced alternative first tool).

    Everything else is the inner env's; the hint is a prompt message (loss mask 0), not a forced sample.
    """

    def __init__(self, env: Any, tool: str) -> None:
        object.__setattr__(self, "_env", env)
        object.__setattr__(self, "hint", f"Start by calling the `{tool}` tool.")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._env, name, value)  # e.g. the loop setting ``training`` must reach the inner env

    async def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        messages, info = await maybe_await(self._env.reset(task, seed=seed))
        return [*messages, Message("user", self.hint)], {**info, "first_tool_hint": self.hint}


def with_first_tool_hints(
    env_factory: Callable[[], Any],
    config: MitigationConfig,
    last_batch: Sequence[Trajectory],
    tool_names: Iterable[str],
    monitors: Monitors | None = None,
) -> Callable[[], Any]:
    """An env factory for ``run_episodes`` that wraps every ``first_tool_hint_every``-th env in ``FirstToolHint``.

    The counter makes the choice deterministic for a given order of env creation.
    """
    tool = least_used_first_tool(last_batch, tool_names)
    if not config.first_tool_hint_every or tool is None or not _exploring(config, monitors):
        return env_factory
    made = 0

    def factory() -> Any:
        nonlocal made
        made += 1
        env = env_factory()
        return FirstToolHint(env, tool) if made % config.first_tool_hint_every == 0 else env

    return factory
