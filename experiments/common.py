"""Helpers the learning recipes share beyond tool_use.py's (issue 14): stage processes and per-task summaries.

``run_arm(...)`` trains and evaluates one arm of a recipe for its wall-clock budget (resumable);
``child(script, stage, log_dir, threads)`` starts one stage of a recipe script as a child process in a session of
its own; ``summarise(rows, task_ids, metrics, seed)`` turns per-episode rows into per-task means and their mean
over tasks with a percentile-bootstrap 95% CI (tasks, not episodes, are the unit of resampling).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def child(script: str, stage: str, log_dir: Path, threads: int) -> subprocess.Popen[bytes]:
    """``script`` rerun with this process's arguments as the child ``stage``, its output in log_dir/stage.log."""
    cmd = [sys.executable, script, *sys.argv[1:], "--child", stage, "--threads", str(threads)]
    log = open(log_dir / f"{stage}.log", "a")  # noqa: SIM115 - the child writes it until it exits
    # A session of its own: with the kernel's autogroup scheduling each arm then gets its own fair CPU share.
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            start_new_session=True)  # fmt: skip



def run_stages(script: str, stages: Sequence[str], log_dir: Path, *, threads: int, limit: int = 0) -> None:
    """Each stage of ``script`` as a child process (``child``), at most ``limit`` at once (0: all), the next
    starting as one ends; exits naming the stages that failed. Four tool-use arms at once peaked near 7 GB each and
    one was OOM-killed on a 24 GB machine: tool_use.py's ``--parallel-arms`` sets ``limit``."""
    limit = limit or len(stages)
    pending, running, failed = list(stages), {}, []
    while pending or running:
        while pending and len(running) < limit:
            stage = pending.pop(0)
            running[stage] = child(script, stage, log_dir, threads=threads)
        done = next((stage for stage, process in running.items() if process.poll() is not None), None)
        if done is None:
            time.sleep(1.0)
            continue
        if running.pop(done).returncode != 0:
            failed.append(done)
    if failed:
        sys.exit(f"stage(s) {failed} failed; see {log_dir}/<stage>.log (rerun with --resume to continue)")

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


def step_row(step: int, metrics: dict[str, Any], elapsed: float, keys: Sequence[str]) -> dict[str, Any]:
    """One training step of an arm's record: its number, training seconds so far and the recipe's metrics."""
    return {"step": step, "train_s": elapsed, **{k: metrics.get(k) for k in keys}}


def lost_steps(arm_dir: Path, steps: list[dict[str, Any]], completed: int, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of steps the checkpoint holds but the record missed (killed between the checkpoint and the record's
    save), rebuilt from the trainer's metrics.jsonl, so their training time still counts against the budget."""
    last = steps[-1]["step"] if steps else 0
    path = arm_dir / "metrics.jsonl"
    if completed <= last or not path.exists():
        return []
    elapsed, rows = steps[-1]["train_s"] if steps else 0.0, []
    for line in path.read_text().splitlines():
        metrics = json.loads(line)
        if last < metrics.get("step", 0) <= completed and metrics["step"] not in {r["step"] for r in rows}:
            elapsed += metrics.get("charts/step_time_s") or 0.0
            rows.append({**step_row(metrics["step"], metrics, elapsed, keys), "recovered": True})
    return rows


def last_step_s(steps: Sequence[dict[str, Any]]) -> float:
    """Seconds the arm's latest step took: the forecast of its next one."""
    return steps[-1]["train_s"] - (steps[-2]["train_s"] if len(steps) > 1 else 0.0)


def run_arm(arm: str, seed_dir: Path, start: Path, args: Any, *, stage_config: Callable[..., dict[str, Any]],
            held_out: Callable[..., dict[str, Any]], final_evals: Callable[[Any, Any], dict[str, Any]],
            step_keys: Sequence[str]) -> None:  # fmt: skip
    """Child: one arm of a recipe, trained for ``args.minutes`` of training wall-clock or its config's ``steps``
    (``--max-steps``), whichever ends first (resuming its checkpoint and record), with ``args.curve_points``
    held-out curve points on the way, then ``final_evals``. No step starts
    that the previous step's duration says would end past the budget, so arms whose steps differ in length train
    for about the same time (the swarm's seed-0 GRPO arm once overran by 48%). The recipe supplies its stage
    config, its held-out evaluation and the step metrics it records."""
    import torch

    torch.set_num_threads(args.threads)
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    record_path = seed_dir / f"{arm}.json"
    if record_path.exists() and "final" in json.loads(record_path.read_text()):
        return  # finished: a --resume only rebuilds the results
    stage = stage_config(arm, seed_dir / arm, start, args)
    if arm == "sft_only":  # a data stream of its own: from the warm start's seed it would replay its batches first
        from taskrl.seeding import sft_only_seed

        stage["seed"] = sft_only_seed(stage.get("seed", 0))
    config = config_from_dict(stage)
    trainer = Trainer(config)
    try:
        trainer.train(until=0)  # resume: loads the latest checkpoint, if any
        record: dict[str, Any] = {"arm": arm, "config": config.to_dict(), "threads": args.threads, "steps": [],
                                  "curve": []}  # fmt: skip
        if record_path.exists():
            record = json.loads(record_path.read_text())
            record["steps"] = [s for s in record["steps"] if s["step"] <= (trainer.completed or 0)]
        record["steps"] += lost_steps(seed_dir / arm, record["steps"], trainer.completed or 0, step_keys)
        save = lambda: record_path.write_text(json.dumps(record, indent=1))  # noqa: E731
        budget = args.minutes * 60
        curve_at = [budget * (i + 1) / (args.curve_points + 1) for i in range(args.curve_points)]
        done_curve = {round(c["at_s"]) for c in record["curve"]}
        elapsed = record["steps"][-1]["train_s"] if record["steps"] else 0.0
        within_steps = lambda: (trainer.completed or 0) < config.steps  # noqa: E731  (--max-steps: a step budget)
        while within_steps() and elapsed < budget and (
            not record["steps"] or elapsed + last_step_s(record["steps"]) <= budget
        ):
            began = time.monotonic()
            (metrics,) = trainer.train(until=(trainer.completed or 0) + 1)
            elapsed += time.monotonic() - began
            record["steps"].append(step_row(trainer.completed, metrics, elapsed, step_keys))
            for at in curve_at:
                if elapsed >= at and round(at) not in done_curve:
                    point = held_out(trainer, f"curve_{round(at)}", args, n=args.curve_tasks, sampled=False)
                    point.pop("per_task", None)  # the curve plots means; per-task values serve paired finals
                    record["curve"].append({"at_s": at, "train_s": elapsed, "step": trainer.completed, **point})
                    done_curve.add(round(at))
            save()
        record["train_s"] = elapsed
        record["final"] = final_evals(trainer, args)
        save()
    finally:
        trainer.close()


def run_sft(sft_dir: Path, args: Any, *, stage_config: Callable[..., dict[str, Any]],
            start_evals: Callable[[Any], dict[str, Any]]) -> None:  # fmt: skip
    """Child: a recipe's common warm start. SFT (``stage_config("sft", ...)``), merged into the base model at
    sft_dir/start, then evaluated as the arms will load it (``start_evals`` on an ``sft_only`` trainer from the
    merged checkpoint). A finished warm start made with another config is refused (``--redo-sft``)."""
    import torch

    torch.set_num_threads(args.threads)
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    start, record_path = sft_dir / "start", sft_dir / "start.json"
    config = stage_config("sft", sft_dir / "sft", None, args)
    if record_path.exists():
        if json.loads(record_path.read_text())["config"] != config:
            sys.exit(f"{sft_dir} holds a warm start made with another config; pass --redo-sft")
        return
    if not (start / "config.json").exists():
        trainer = Trainer(config_from_dict(dict(config)))
        try:
            trainer.train()
            merged = trainer.learner.model.merge_and_unload()
            merged.save_pretrained(str(start))
            trainer.learner_policy.chat_format.tokenizer.save_pretrained(str(start))
        finally:
            trainer.close()
    if json.loads((sft_dir / "sft" / "config.json").read_text()).get("steps") != config.get("steps"):
        sys.exit(f"{sft_dir} holds a warm start made with another config; pass --redo-sft")
    metrics = sft_dir / "sft" / "metrics.jsonl"  # read back: also right after a kill during the evaluation
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    record = {"config": config, "sft_steps": config.get("steps"), "sft_s": sum(r["charts/step_time_s"] for r in rows),
              "sft_nll": [r.get("losses/sft_nll") for r in rows], "step_s": [r.get("charts/step_time_s") for r in rows],
              "expert_reward": [r.get("rewards/total") for r in rows]}  # fmt: skip
    trainer = Trainer(config_from_dict(stage_config("sft_only", sft_dir / "start_eval", start, args)))
    try:
        record.update(start_evals(trainer))
        record_path.write_text(json.dumps(record, indent=1))
    finally:
        trainer.close()


def fresh_dirs(seed_dir: Path, sft_dir: Path, args: Any) -> None:
    """The seed's run directory starts over unless ``--resume``; the warm start's only with ``--redo-sft``."""
    import shutil

    for directory, fresh in ((seed_dir, not args.resume), (sft_dir, args.redo_sft)):
        if directory.exists() and fresh:
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)


def save_seed(data_path: Path, seed: int, result: dict[str, Any]) -> dict[str, Any]:
    """Add (or replace) one seed's result in the recipe's JSON of every seed run so far; returns the whole file."""
    data = json.loads(data_path.read_text()) if data_path.exists() else {"seeds": {}}
    data["seeds"][str(seed)] = result
    data_path.parent.mkdir(parents=True, exist_ok=True)
    data_path.write_text(json.dumps(data, indent=1))
    return data
