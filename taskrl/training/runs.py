"""Resuming a run directory: find its last checkpoint, refuse a resume under a different config, and drop what
the killed run logged after that checkpoint (those steps are replayed, and would otherwise appear twice).
No torch here: the CLI uses it to answer "already done" without loading a model.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from taskrl.training.config import ConfigError, TrainConfig, dotted, migrate_flat

RESUME_MAY_CHANGE = frozenset({
    "steps", "resume", "progress", "checkpoint_every", "keep_checkpoints", "log_trajectories", "device",
    "eval_every", "eval_tasks", "log_backends",
    # where rollouts and updates run, not what they compute (same seeds per episode; float rounding aside)
    "placement.rollout_url", "placement.rollout_api_key_env", "placement.ray", "placement.ray_address",
    "placement.ray_workers", "placement.ray_num_cpus_per_worker", "placement.ray_num_gpus_per_worker",
    "placement.nproc", "placement.dist_backend",
})  # fmt: skip
"""Keys (dotted) that do not change what the run computes, so a resumed run may change them."""

_STEP_SUFFIX = re.compile(r"_(\d+)$")
CHECKPOINTS = "checkpoints"
LATEST = "latest"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        path = root / pointer.read_text().strip()
        if (path / "state.json").is_file():
            return path
    complete = sorted(p for p in root.glob("step_*") if (p / "state.json").is_file())
    return complete[-1] if complete else None


def completed_steps(run_dir: str | Path) -> int:
    """Steps covered by the run directory's latest checkpoint (0 without one)."""
    checkpoint = latest_checkpoint(run_dir)
    return int(json.loads((checkpoint / "state.json").read_text())["step"]) if checkpoint else 0


def check_resumable(run_dir: Path, config: TrainConfig, *, has_checkpoint: bool) -> None:
    """Raise ``ConfigError`` when ``run_dir`` holds a run that this config must not continue."""
    started = has_checkpoint or (run_dir / "metrics.jsonl").exists()
    if not started:
        return
    if not config.resume:
        raise ConfigError(
            f"run_dir {str(run_dir)!r} already holds a run; set resume=true to continue it or choose another run_dir"
        )
    saved_path = run_dir / "config.json"
    if not saved_path.exists():
        return
    # A run directory written before configs had sections holds a flat config.json: converted here, once, by the
    # table of moved keys (the trainer then rewrites config.json in the nested form).
    saved = dotted(migrate_flat(json.loads(saved_path.read_text())))
    current = dotted(json.loads(json.dumps(config.to_dict(), default=str)))
    changed = sorted(k for k, v in current.items() if k not in RESUME_MAY_CHANGE and k in saved and saved[k] != v)
    if changed:
        details = ", ".join(f"{k}: {saved[k]!r} -> {current[k]!r}" for k in changed[:6])
        raise ConfigError(
            f"run_dir {str(run_dir)!r} was started with a different config ({details}); "
            "resume with the original values or choose another run_dir"
        )


def rewind_run_dir(run_dir: Path, step: int) -> None:
    """Keep only what was logged for steps <= ``step`` (metrics, alerts, trajectories, step evaluations)."""
    for name in ("metrics.jsonl", "alerts.jsonl"):
        path = run_dir / name
        if not path.exists():
            continue
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # the torn last line of a killed writer
                continue
            if int(row.get("step", 0)) <= step:
                kept.append(line)
        tmp = path.with_suffix(".rewind.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    for pattern in ("trajectories/*.jsonl", "eval/step_*.json"):
        for path in run_dir.glob(pattern):
            match = _STEP_SUFFIX.search(path.stem)
            if match and int(match.group(1)) > step:
                path.unlink()
