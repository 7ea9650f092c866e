"""The batch monitors that apply to any env; each maps (batch, config, tool names) to a value, or None when it
does not apply to the batch. Swarm monitors are in ``taskrl.monitors.swarm``."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from taskrl.monitors.config import MonitorConfig
from taskrl.monitors.episode import (
    _entropy_bits,
    _rate,
    failed_checks,
    is_question,
    is_success,
    task_size,
    tool_calls,
)
from taskrl.types import Trajectory


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
    """Tool calls in the batch per solved item: a successful episode counts its task's items (``info["task_size"]``,
    e.g. a swarm table's rows; 1 when unknown), so wider tasks are allowed more calls. None while nothing succeeds."""
    solved = sum(task_size(t) for t in trajs if is_success(t, cfg.success_threshold))
    if not solved:
        return None
    return sum(t.metrics.get("tool_calls", len(tool_calls(t))) for t in trajs) / solved


def loop_rate(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of episodes where one (tool, arguments) call repeats ``loop_repeats`` times or a loop was flagged."""
    return _rate([
        bool(t.metrics.get("loop_detections")) or max(Counter(tool_calls(t)).values(), default=0) >= cfg.loop_repeats
        for t in trajs
    ])  # fmt: skip


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


_CALL_TAGS = r"<tool_call>|</?function[=>\s]|\[TOOL_CALLS\]|<\|python_tag\|>|</?tool_use>|<\|tool_call"
"""What tool-call formats look like (Hermes, Llama 3, Mistral, Claude-style, ...), whichever parser is in use."""


def tool_calls_per_episode(
    trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None
) -> float | None:
    """Well-formed tool calls the parser found per episode (infrastructure failures left out). Near 0 in an env
    with tools is a silent collapse (a parser that no longer matches the model's format, a policy that stopped
    using its tools) even while the reward looks fine; ``Monitors`` also alerts on a fall from its peak."""
    episodes = [t for t in trajs if t.infra_failure is None]
    if not episodes:
        return None
    calls = [t.metrics.get("tool_calls", float(len(tool_calls(t)))) - t.metrics.get("invalid_tool_calls", 0.0)
             for t in episodes]  # fmt: skip
    return max(0.0, sum(calls) / len(episodes))


def capped_success(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of successful episodes with a turn cut short by ``max_new_tokens`` (``metrics["capped_turns"]``):
    the loop still runs a capped turn's complete calls, so a policy can succeed by letting the cap end its turn
    instead of ending it, and fails once the cap moves (issue 40's ladder: nearly every 3-item success of its RL
    arms). None while nothing succeeds."""
    return _rate([t.metrics.get("capped_turns", 0.0) > 0 for t in trajs
                  if t.infra_failure is None and is_success(t, cfg.success_threshold)])  # fmt: skip


def unparsed_tool_calls(trajs: Sequence[Trajectory], cfg: MonitorConfig, tools: frozenset[str] | None) -> float | None:
    """Share of assistant turns that parsed no tool call although their text looks like one (a ``<tool_call>``,
    ``<function=...>``, ``[TOOL_CALLS]`` tag, or JSON naming one of the env's tools): parse failures that no
    invalid-call count sees, because the turn was taken for a final answer."""
    pattern = _CALL_TAGS
    if tools:
        names = "|".join(re.escape(name) for name in sorted(tools))
        pattern += rf"|[\"']name[\"']\s*:\s*[\"']({names})[\"']"
    looks_like_call = re.compile(pattern, re.I)
    turns = [m for t in trajs if t.infra_failure is None for m in t.messages if m.role == "assistant"]
    if not turns:
        return None
    return sum(not m.tool_calls and looks_like_call.search(m.content or "") is not None for m in turns) / len(turns)
