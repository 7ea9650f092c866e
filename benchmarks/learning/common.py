"""Helpers the learning recipes share beyond tool_use.py's (issue 14): stage processes and per-task summaries.

``child(script, stage, log_dir, threads)`` starts one stage of a recipe script as a child process in a session of
its own; ``summarise(rows, task_ids, metrics, seed)`` turns per-episode rows into per-task means and their mean
over tasks with a percentile-bootstrap 95% CI (tasks, not episodes, are the unit of resampling).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def child(script: str, stage: str, log_dir: Path, threads: int) -> subprocess.Popen[bytes]:
    """``script`` rerun with this process's arguments as the child ``stage``, its output in log_dir/stage.log."""
    cmd = [sys.executable, script, *sys.argv[1:], "--child", stage, "--threads", str(threads)]
    log = open(log_dir / f"{stage}.log", "a")  # noqa: SIM115 - the child writes it until it exits
    # A session of its own: with the kernel's autogroup scheduling each arm then gets its own fair CPU share.
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            start_new_session=True)  # fmt: skip


def summarise(rows: Sequence[dict[str, Any]], task_ids: Sequence[str], metrics: Sequence[str],
              seed: int) -> dict[str, Any]:  # fmt: skip
    """Per-task means of each metric (NaN values skipped; a task with none scores 0) and their mean over tasks
    with a bootstrap 95% CI; ``per_task`` keeps the per-task means in ``task_ids`` order for paired deltas."""
    from taskrl.eval import bootstrap_ci

    by_task: dict[str, list[dict[str, Any]]] = {tid: [] for tid in task_ids}
    for row in rows:
        by_task[row["task_id"]].append(row)
    out: dict[str, Any] = {"tasks": len(task_ids), "episodes": len(rows), "per_task": {}}
    for key in metrics:
        per_task = []
        for tid in task_ids:
            values = [r[key] for r in by_task[tid] if not math.isnan(r[key])]
            per_task.append(sum(values) / len(values) if values else 0.0)
        ci = bootstrap_ci(per_task, seed=seed)
        out[key] = {"value": sum(per_task) / len(per_task), "low": ci[0] if ci else None,
                    "high": ci[1] if ci else None}  # fmt: skip
        out["per_task"][key] = per_task
    out["errors"] = sum(r.get("error") is not None for r in rows)
    return out
