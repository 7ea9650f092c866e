"""The run directory: what a training, evaluation or rollout run writes, and how to read it back.

Layout (every writer appends and flushes, so a killed run keeps what it logged)::

    RUN_DIR/config.json                  the resolved config of the run
    RUN_DIR/metrics.jsonl                one line per step: {"step", "time", "<namespace>/<name>": value, ...}
    RUN_DIR/alerts.jsonl                 monitor alerts: {"step", "monitor", "value", "threshold", "message"}
    RUN_DIR/trajectories/NAME_STEP.jsonl trajectories of a step (NAME: train, eval, ...)
    RUN_DIR/eval/NAME.json               evaluation results

Metric names are namespaced as in CleanRL: ``losses/*``, ``charts/*``, ``rewards/*``, ``tools/*``, ``monitor/*``.
JSONL is always written; ``RunLog(dir, backends=("tensorboard", "wandb", "mlflow"))`` mirrors metrics, alerts and
the config to those too (installed with ``pip install 'taskrl[observability]'``; W&B runs offline, MLflow writes
under ``RUN_DIR/mlruns`` unless ``MLFLOW_TRACKING_URI`` names a server).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence
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


BACKENDS = ("tensorboard", "wandb", "mlflow")


class BackendUnavailableError(ImportError):
    """A logging backend was asked for but its package is not installed."""


class RunLog:
    """Writes one run directory. Cheap to create; safe to reopen on resume (it appends).

    ``backends`` names optional mirrors (``BACKENDS``); each is opened here, so a missing package fails at
    start, not mid-run. Call ``close()`` (or use ``with RunLog(...)``) to flush them.
    """

    def __init__(self, run_dir: str | Path, *, backends: Sequence[str] = (), project: str = "taskrl") -> None:
        unknown = sorted(set(backends) - set(BACKENDS))
        if unknown:
            raise ValueError(f"RunLog backends {unknown} unknown; choose from {', '.join(BACKENDS)}")
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._start = time.time()
        self._backends = [_BACKEND_CLASSES[name](self.dir, project) for name in dict.fromkeys(backends)]

    def write_config(self, config: Any) -> None:
        data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
        (self.dir / "config.json").write_text(json.dumps(data, indent=2, default=str))
        for backend in self._backends:
            backend.config(json.loads(json.dumps(data, default=str)))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one step's metrics."""
        row = {"step": int(step), "time": round(time.time() - self._start, 3)}
        row.update({k: _clean(v) for k, v in metrics.items()})
        self._append("metrics.jsonl", row)
        if self._backends:
            numbers = {k: float(v) for k, v in row.items() if k not in ("step", "time") and _finite_number(v)}
            for backend in self._backends:
                backend.log(int(step), numbers)

    def alert(self, step: int, monitor: str, value: float, threshold: float, message: str) -> None:
        row = {"step": int(step), "monitor": monitor, "value": _clean(value), "threshold": threshold,
               "message": message}  # fmt: skip
        self._append("alerts.jsonl", row)
        for backend in self._backends:
            backend.alert(int(step), monitor, message)

    def close(self) -> None:
        """Flush and close the backends (JSONL needs nothing: every write is already on disk)."""
        for backend in self._backends:
            backend.close()
        self._backends = []

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _require(module: str, backend: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise BackendUnavailableError(
            f"RunLog backend '{backend}' needs a package that is not installed ({e.name}); "
            "pip install 'taskrl[observability]' or drop it from backends"
        ) from e


class _TensorBoard:
    """Scalars per step; alerts as text under ``alerts/<monitor>``. Files under RUN_DIR/tensorboard."""

    def __init__(self, run_dir: Path, project: str) -> None:
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def config(self, data: dict[str, Any]) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(data, indent=2) + "\n```")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def alert(self, step: int, monitor: str, message: str) -> None:
        self.writer.add_text(f"alerts/{monitor}", message, step)

    def close(self) -> None:
        self.writer.close()


class _WandB:
    """A W&B run under RUN_DIR/wandb: offline by default (``wandb sync`` uploads it later; no network), or as
    ``WANDB_MODE`` says (online, disabled); ``WANDB_PROJECT`` names the project, as W&B users expect."""

    def __init__(self, run_dir: Path, project: str) -> None:
        wandb = _require("wandb", "wandb")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or project, name=run_dir.name,
                              dir=str(run_dir), mode=os.environ.get("WANDB_MODE") or "offline",
                              settings=wandb.Settings(silent=True))  # fmt: skip

    def config(self, data: dict[str, Any]) -> None:
        self.run.config.update(data, allow_val_change=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def alert(self, step: int, monitor: str, message: str) -> None:
        self.run.summary[f"alerts/{monitor}"] = f"step {step}: {message}"

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    """One MLflow run per RunLog: ``MLFLOW_TRACKING_URI`` when set, else a file store under RUN_DIR/mlruns."""

    def __init__(self, run_dir: Path, project: str) -> None:
        _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):  # the local file store still works but is opt-in since MLflow 3
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id

    def config(self, data: dict[str, Any]) -> None:
        for key, value in data.items():  # MLflow params are short strings
            self.client.log_param(self.run_id, key, json.dumps(value, default=str)[:500])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def alert(self, step: int, monitor: str, message: str) -> None:
        self.client.set_tag(self.run_id, f"alert.{monitor}", f"step {step}: {message}"[:5000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_BACKEND_CLASSES: dict[str, Any] = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}


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
