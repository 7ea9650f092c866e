"""What the HTML report shows, as one JSON-safe payload built from a run directory or a trajectories JSONL file.

``load_payload(path)`` reads ``metrics.jsonl``, ``alerts.jsonl``, ``eval/*.json`` and ``trajectories/*.jsonl``
(the ``taskrl.runlog`` layout), or a bare JSONL file, and derives the trajectory views: messages with pruned
chunks and summaries marked, token usage per turn (from the exact segments), the reward breakdown, and for swarm
episodes a timeline of sub-agents with the critical path. Monitors are computed here when the run logged none.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from taskrl.monitor import MONITORS, MonitorConfig, Monitors
from taskrl.runlog import read_alerts, read_metrics
from taskrl.types import Message, Trajectory, read_jsonl

# A chunk in tool output starts at a header line "[chunk ID]" and runs to the next header (docs/design/search.md).
CHUNK_HEADER_RE = re.compile(r"^\[chunk ([^\]\s]+)\][^\n]*$", re.M)
_SHOWN_INFO = ("final_answer", "truncation", "pruned_chunk_ids", "summaries", "first_tool_hint", "untrainable_reason")


class ReportError(ValueError):
    """The report cannot be built from the given path (nothing to show, unreadable files)."""


def json_safe(value: Any) -> Any:
    """NaN and infinities become None (JSON has no such numbers); containers are copied recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def token_usage(traj: Trajectory) -> dict[str, Any]:
    """Context size after each turn and tokens sampled in it, from the segments (exact) or the text (estimated).

    In a segment every maximal run of loss_mask 1 is one sampled turn; a new segment means the context was
    rebuilt (pruning, a summary), which the chart marks as a reset.
    """
    turns: list[dict[str, Any]] = []
    for index, seg in enumerate(traj.segments):
        run_start = None
        for pos, mask in enumerate([*seg.loss_mask, 0]):
            if mask and run_start is None:
                run_start = pos
            elif not mask and run_start is not None:
                turns.append({"turn": len(turns) + 1, "context": pos, "sampled": pos - run_start,
                              "reset": index > 0 and not any(t["segment"] == index for t in turns),
                              "segment": index})  # fmt: skip
                run_start = None
    if turns:
        return {"estimated": False, "turns": turns}
    chars = 0
    for m in traj.messages:  # message-mode backends reported no tokens: ~4 characters per token
        chars += len(m.content) + sum(len(json.dumps(c.arguments)) + len(c.name) for c in m.tool_calls)
        if m.role == "assistant":
            sampled = (len(m.content) + sum(len(json.dumps(c.arguments)) for c in m.tool_calls)) // 4
            turns.append({"turn": len(turns) + 1, "context": chars // 4, "sampled": sampled, "reset": False,
                          "segment": 0})  # fmt: skip
    return {"estimated": True, "turns": turns}


def split_chunks(content: str, pruned: set[str]) -> list[dict[str, Any]] | None:
    """Tool output cut into text and chunk parts (None when it holds no chunk header)."""
    headers = list(CHUNK_HEADER_RE.finditer(content))
    if not headers:
        return None
    parts: list[dict[str, Any]] = []
    if headers[0].start() > 0:
        parts.append({"text": content[: headers[0].start()]})
    for i, h in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(content)
        chunk_id = h.group(1)
        parts.append({"text": content[h.start() : end], "chunk_id": chunk_id, "pruned": chunk_id in pruned})
    return parts


def _message_view(m: Message, pruned: set[str], summaries: list[str], is_summary: bool) -> dict[str, Any]:
    view: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        view["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    if m.name:
        view["name"] = m.name
    if m.role == "tool" and (parts := split_chunks(m.content, pruned)):
        view["parts"] = parts
    text = m.content.strip()
    if is_summary or (text and any(text == s or (len(s) > 40 and s in text) for s in summaries)):
        view["summary"] = True
    return view


def critical_path(spans: list[tuple[float, float]]) -> list[bool]:
    """Which sub-agents bound the episode's wall time: in each wave of overlapping runs, the one ending last.

    Sub-agents assigned in one orchestrator turn run concurrently and the turn waits for the slowest, so the
    path through the waves' slowest members is the critical path (docs/design/index.md §7, critical steps).
    """
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    critical = [False] * len(spans)
    wave: list[int] = []
    wave_end = -math.inf
    for i in [*order, None]:
        if i is None or spans[i][0] >= wave_end:
            if wave:
                critical[max(wave, key=lambda j: spans[j][1])] = True
            if i is None:
                break
            wave, wave_end = [], -math.inf
        wave.append(i)
        wave_end = max(wave_end, spans[i][1])
    return critical


def timeline(traj: Trajectory) -> dict[str, Any] | None:
    """Gantt rows of the sub-agents (children with ``info["started_at"]``/``["ended_at"]``) and the critical path."""
    timed = [c for c in traj.children
             if isinstance(c.info.get("started_at"), int | float) and isinstance(c.info.get("ended_at"), int | float)]
    if not timed:
        return None
    spans = [(float(c.info["started_at"]), float(max(c.info["started_at"], c.info["ended_at"]))) for c in timed]
    flags = critical_path(spans)
    rows = [{"id": c.id, "name": str(c.info.get("name") or c.task_id or c.id), "start": start, "end": end,
             "reward": c.reward, "answer": (c.final_answer or "")[:300], "finished": c.terminated,
             "steps": c.metrics.get("turns"), "critical": bool(c.info.get("critical", flag))}
            for c, (start, end), flag in zip(timed, spans, flags, strict=True)]  # fmt: skip
    start = traj.info.get("started_at", min(s for s, _ in spans))
    end = traj.info.get("ended_at", max(e for _, e in spans))
    return {"start": float(start), "end": float(max(end, start)), "rows": rows,
            "critical_steps": traj.metrics.get("critical_steps")}  # fmt: skip


def trajectory_view(traj: Trajectory, *, source: str, step: int, index: int) -> dict[str, Any]:
    """Everything the viewer shows about one episode (token ids are left out: the counts are kept)."""
    pruned = {str(c) for c in traj.info.get("pruned_chunk_ids", [])}
    records = [s for s in traj.info.get("summaries", []) if isinstance(s, dict)]
    summaries = [str(s.get("text", "")).strip() for s in records if s.get("text")]
    summary_at = {s["message_index"] for s in records if isinstance(s.get("message_index"), int)}
    return {
        "key": f"{source}/{step}/{index}",
        "id": traj.id,
        "source": source,
        "step": step,
        "task_id": traj.task_id,
        "env": traj.env,
        "reward": traj.reward,
        "rewards": traj.rewards,
        "metrics": traj.metrics,
        "terminated": traj.terminated,
        "truncated": traj.truncated,
        "error": traj.error,
        "trainable": traj.trainable,
        "info": {k: traj.info[k] for k in _SHOWN_INFO if k in traj.info},
        "messages": [_message_view(m, pruned, summaries, i in summary_at) for i, m in enumerate(traj.messages)],
        "tokens": token_usage(traj),
        "segments": [{"tokens": len(s), "sampled": s.num_sampled, "policy_version": s.policy_version}
                     for s in traj.segments],  # fmt: skip
        "timeline": timeline(traj),
        "children": [trajectory_view(c, source=source, step=step, index=i) for i, c in enumerate(traj.children)],
    }


def _select(trajectories: list[Trajectory], quota: int) -> list[int]:
    """Indices to show when a step has more episodes than its quota: best and worst first, then in order."""
    if len(trajectories) <= quota:
        return list(range(len(trajectories)))
    by_reward = sorted(range(len(trajectories)), key=lambda i: trajectories[i].reward)
    picked: list[int] = []
    while len(picked) < quota:
        for i in (by_reward.pop(), by_reward.pop(0)) if len(by_reward) > 1 else (by_reward.pop(),):
            if len(picked) < quota:
                picked.append(i)
    return sorted(picked)


def _trajectory_files(run_dir: Path) -> dict[tuple[str, int], Path]:
    files = {}
    for path in sorted((run_dir / "trajectories").glob("*_*.jsonl")):
        source, _, step = path.stem.rpartition("_")
        if step.isdigit():
            files[(source, int(step))] = path
    return files


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _monitor_config(config: dict[str, Any] | None) -> MonitorConfig:
    """The run's monitor thresholds when its config recorded them (key ``monitor`` or ``monitors``), else defaults."""
    raw = (config or {}).get("monitor") or (config or {}).get("monitors")
    if isinstance(raw, dict):
        known = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()
                 if k in MonitorConfig.__dataclass_fields__}  # fmt: skip
        try:
            return MonitorConfig(**known)
        except (TypeError, ValueError):
            pass
    return MonitorConfig()


def load_payload(path: str | Path, *, max_trajectories: int = 300, title: str | None = None) -> dict[str, Any]:
    """Read a run directory (or a trajectories JSONL file) into the report's payload."""
    path = Path(path)
    if not path.exists():
        raise ReportError(f"{path} does not exist; give a run directory or a trajectories .jsonl file")
    config: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = []
    alerts: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    files: dict[tuple[str, int], Path] = {}
    if path.is_dir():
        config = _read_json(path / "config.json")
        metrics, alerts = read_metrics(path), read_alerts(path)
        evals = [{"name": p.stem, **e} for p in sorted((path / "eval").glob("*.json")) if (e := _read_json(p))]
        files = _trajectory_files(path)
        if not files and (path / "trajectories.jsonl").exists():  # a `taskrl rollout`/old demo output directory
            files = {("rollout", 0): path / "trajectories.jsonl"}
            config = config or _read_json(path / "trajectories.meta.json")
    elif path.suffix == ".jsonl":
        files = {("rollout", 0): path}
        config = _read_json(path.with_suffix(".meta.json"))
    else:
        raise ReportError(f"{path} is neither a run directory nor a .jsonl file of trajectories")
    if not (metrics or alerts or evals or files):
        raise ReportError(f"{path} holds no metrics, alerts, evaluations or trajectories (see taskrl/runlog.py)")

    loaded = {key: read_jsonl(str(p)) for key, p in files.items()}
    quota = max(1, max_trajectories // max(1, len(loaded)))
    views = [trajectory_view(trajs[i], source=source, step=step, index=i)
             for (source, step), trajs in sorted(loaded.items(), key=lambda kv: (kv[0][1], kv[0][0]))
             for i in _select(trajs, quota)]  # fmt: skip

    monitors_source = "run"
    if not any(k.startswith("monitor/") for row in metrics for k in row):
        monitors_source = "report"  # the run logged no monitors: compute them per logged batch
        mon = Monitors(_monitor_config(config), log_alerts=False)  # the report shows them
        by_step: dict[int, dict[str, Any]] = defaultdict(dict)
        for row in metrics:
            by_step[int(row.get("step", 0))].update(row)
        for (source, step), trajs in sorted(loaded.items()):
            values, raised = mon.check(step, trajs)
            prefix = "" if source in ("train", "rollout") else f"{source}:"
            by_step[step].update({f"{prefix}{k}": v for k, v in values.items()})
            by_step[step]["step"] = step
            alerts += [{**a.to_dict(), "monitor": f"{prefix}{a.monitor}", "source": "report"} for a in raised]
        metrics = [by_step[s] for s in sorted(by_step)]

    cfg = _monitor_config(config)
    thresholds = {name: {"threshold": cfg.threshold(name), "above": spec.bad_when_above,
                         "meaning": spec.meaning} for name, spec in MONITORS.items()}  # fmt: skip
    steps = [int(row.get("step", i)) for i, row in enumerate(metrics)]
    numeric = {k for row in metrics for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    names = sorted(numeric - {"step", "time"})
    series = {name: [row.get(name) for row in metrics] for name in names}
    episodes = sum(len(t) for t in loaded.values())
    return json_safe({
        "title": title or (path.name if path.is_dir() else path.stem),
        "source": str(path),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "config": config,
        "metrics": {"steps": steps, "series": series},
        "monitors": {"source": monitors_source, "thresholds": thresholds},
        "alerts": alerts,
        "evals": evals,
        "episodes": episodes,
        "trajectories": views,
    })  # fmt: skip
