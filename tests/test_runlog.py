"""The run directory: layout, torn lines, resume by reopening, and the optional TensorBoard / W&B / MLflow mirrors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from taskrl.runlog import BackendUnavailableError, RunLog, read_alerts, read_metrics, read_trajectories
from taskrl.types import Trajectory


def test_layout_appends_and_survives_a_torn_line(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log.write_config({"lr": 1e-5})
    log.log(0, {"losses/loss": 1.5, "charts/nan": float("nan")})
    log.alert(0, "loop_rate", 0.5, 0.2, "loops")
    log.write_trajectories(0, [Trajectory(task_id="a")])
    log.write_eval("final", {"ok": True})
    RunLog(tmp_path).log(1, {"losses/loss": 1.0})  # reopened on resume: appends
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "losses/lo')  # killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]
    assert read_alerts(tmp_path)[0]["monitor"] == "loop_rate"
    assert read_trajectories(tmp_path)[0][0].task_id == "a"
    assert json.loads((tmp_path / "config.json").read_text()) == {"lr": 1e-5}
    assert json.loads((tmp_path / "eval" / "final.json").read_text()) == {"ok": True}


def test_unknown_or_missing_backends_fail_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="backends"):
        RunLog(tmp_path, backends=("nope",))
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(BackendUnavailableError, match="taskrl\\[observability\\]"):
        RunLog(tmp_path, backends=("wandb",))


def test_backends_mirror_metrics_alerts_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with RunLog(tmp_path, backends=("tensorboard", "wandb", "mlflow"), project="taskrl-test") as log:
        log.write_config({"lr": 1e-5, "algo": "grpo"})
        for step in range(3):
            log.log(step, {"losses/loss": 1.0 / (step + 1), "charts/note": "text is JSONL only"})
        log.alert(2, "loop_rate", 0.5, 0.2, "loops")
    assert len(read_metrics(tmp_path)) == 3

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [round(e.value, 3) for e in events.Scalars("losses/loss")] == [1.0, 0.5, 0.333]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.search_runs([client.get_experiment_by_name("taskrl-test").experiment_id])[0]
    history = client.get_metric_history(run.info.run_id, "losses/loss")
    assert [m.step for m in history] == [0, 1, 2] and run.data.params["algo"] == '"grpo"'
    assert "alert.loop_rate" in run.data.tags

    offline = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert offline and offline[0].stat().st_size > 0, "W&B wrote an offline run to sync later"


def test_wandb_honours_wandb_mode_and_wandb_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: WANDB_MODE=disabled writes no W&B run; WANDB_PROJECT names the project (offline by default)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with RunLog(tmp_path / "off", backends=("wandb",)) as log:
        log.log(0, {"losses/loss": 1.0})
    assert not list((tmp_path / "off").glob("wandb/offline-run-*"))
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    with RunLog(tmp_path / "on", backends=("wandb",), project="taskrl-test") as log:
        log.log(0, {"losses/loss": 1.0})
        assert log._backends[0].run.project == "from-env"
    assert list((tmp_path / "on").glob("wandb/offline-run-*/run-*.wandb")), "no WANDB_MODE: offline, as before"
