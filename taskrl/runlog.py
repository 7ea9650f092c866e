"""The run directory: what a training, evaluation or rollout run writes, and how to read it back.

Layout (every writer appends and flushes, so a killed run keeps what it logged)::

    RUN_DIR/config.json                  the resolved config of the run
    RUN_DIR/metrics.jsonl                one line per step: {"step", "time", "<namespace>/<name>": value, ...}
    RUN_DIR/alerts.jsonl                 monitor alerts: {"step", "monitor", "value", "threshold", "message"}
    RUN_DIR/trajectories/NAME_STEP.jsonl trajectories of a step (NAME: train, eval, ...)
    RUN_DIR/eval/NAME.json               evaluation results

Metric names are namespaced as in CleanRL: ``losses/*``, ``charts/*``, ``rewards/*``, ``tools/*``, ``monitor/*``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from taskrl.types import Trajectory, read_jsonl


def _clean(value: Any) -> Any:
    """JSON-safe scalars: tensors and numpy numbers become floats, NaN/inf stay (json writes them)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


class RunLog:
    """Writes one run directory. Cheap to create; safe to reopen on resume (it appends)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._start = time.time()

    def write_config(self, config: Any) -> None:
        data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
        (self.dir / "config.json").write_text(json.dumps(data, indent=2, default=str))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one step's metrics."""
        row = {"step": int(step), "time": round(time.time() - self._start, 3)}
        row.update({k: _clean(v) for k, v in metrics.items()})
        self._append("metrics.jsonl", row)

    def alert(self, step: int, monitor: str, value: float, threshold: float, message: str) -> None:
        row = {"step": int(step), "monitor": monitor, "value": _clean(value), "threshold": threshold,
               "message": message}  # fmt: skip
        self._append("alerts.jsonl", row)

    def write_trajectories(self, step: int, trajectories: list[Trajectory], name: str = "train") -> Path:
        path = self.dir / "trajectories" / f"{name}_{step:06d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            for t in trajectories:
                f.write(t.to_json() + "\n")
        return path

    def write_eval(self, name: str, result: dict[str, Any]) -> Path:
        path = self.dir / "eval" / f"{name}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(result, indent=2, default=str))
        return path

    def _append(self, name: str, row: dict[str, Any]) -> None:
        with (self.dir / name).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All metric rows of a run, in order; a torn last line (killed mid-write) is skipped."""
    return _read_rows(Path(run_dir) / "metrics.jsonl")


def read_alerts(run_dir: str | Path) -> list[dict[str, Any]]:
    return _read_rows(Path(run_dir) / "alerts.jsonl")


def read_trajectories(run_dir: str | Path, name: str = "train") -> dict[int, list[Trajectory]]:
    """Trajectories by step for one name (train, eval, ...)."""
    out: dict[int, list[Trajectory]] = {}
    for path in sorted((Path(run_dir) / "trajectories").glob(f"{name}_*.jsonl")):
        out[int(path.stem.rsplit("_", 1)[1])] = read_jsonl(str(path))
    return out


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def finite(values: list[float]) -> list[float]:
    return [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
