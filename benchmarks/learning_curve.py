"""Learning curve: SmolLM2-135M-Instruct (LoRA) trained with GRPO on the `price` tool-use env for a wall-clock budget.

Not run in CI. Each arm is a normal ``Trainer`` run with its own run directory; it plays the held-out tasks
greedily before training (and after the SFT warm start, if any), trains until its budget is spent, and plays
them again. Arms run concurrently as child processes (the CPU threads split between them), so one invocation
takes the budget plus the evaluations. Writes the plot to docs/learning_curve.png and the numbers next to it.

    .venv/bin/python experiments_curve.py [--minutes 30] [--arms grpo,sft+grpo] [--device auto]

Arms: ``grpo`` starts from the bare model (the honest "RL learns" evidence); ``sft+grpo`` first takes
``--sft-steps`` behaviour-cloning steps on the env's expert (the demo's recipe), then GRPO.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ARMS = ("grpo", "sft+grpo")
ROOT = Path(__file__).resolve().parent.parent


PRICE_RECIPE: dict[str, Any] = {
    "model": "smollm2", "env": "price", "finetune": "lora", "lora.rank": 16, "lora.alpha": 32.0, "algo.name": "grpo",
    "sft_data": "expert", "sft_lr": 1e-3, "lr": 2e-4, "rollout.tasks_per_step": 4, "rollout.group_size": 4,
    "rollout.max_turns": 3,
    "rollout.max_new_tokens": 40, "rollout.temperature": 1.0,
}  # fmt: skip
"""The `price` recipe of the issue-3 curve (the demo's recipe until issue 14 moved the demo to `shop`)."""


def arm_config(arm: str, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The `price` recipe with an open-ended step count: the budget ends the run."""
    return {
        **PRICE_RECIPE,
        "run_dir": str(run_dir),
        "device": args.device,
        "resume": False,
        "progress": False,
        "steps": args.max_steps,
        "sft_warmup_steps": args.sft_steps if arm == "sft+grpo" else 0,
        "checkpoint_every": 10,
        "eval_tasks": args.eval_tasks,
        "seed": args.seed,
    }


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    stats = result["policies"]["policy"]
    success = stats["success_rate"]
    return {
        "success_rate": success["value"],
        "success_ci": [success.get("low"), success.get("high")],
        "mean_reward": stats["mean_reward"]["value"],
        "tool_calls": stats["tool_calls"],
        "invalid_tool_calls": stats["invalid_tool_calls"],
    }


def run_arm(arm: str, out: Path, args: argparse.Namespace) -> None:
    """Child process: train one arm for the budget and write ``out`` (JSON) as it goes."""
    import shutil

    import torch

    torch.set_num_threads(args.threads)
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    run_dir = Path(args.run_dir) / arm.replace("+", "_")
    if run_dir.exists():  # every invocation is a fresh curve
        shutil.rmtree(run_dir)
    config = config_from_dict(arm_config(arm, run_dir, args))
    trainer = Trainer(config)
    record: dict[str, Any] = {"arm": arm, "config": config.to_dict(), "threads": args.threads, "steps": []}

    def save() -> None:
        out.write_text(json.dumps(record, indent=1))

    try:
        record["before"] = _summary(trainer.evaluate(0, name="before"))
        save()
        budget_end = time.monotonic() + args.minutes * 60
        started = time.monotonic()
        while time.monotonic() < budget_end and trainer.completed != config.steps:
            (metrics,) = trainer.train(until=(trainer.completed or 0) + 1)
            record["steps"].append({
                "step": trainer.completed,
                "phase": metrics["charts/phase"],
                "reward": metrics["rewards/total"],
                "tool_calls": metrics["tools/tool_calls"],
                "invalid_tool_calls": metrics["tools/invalid_tool_calls"],
                "dropped_groups": metrics.get("charts/dropped_groups"),
                "step_time_s": metrics["charts/step_time_s"],
                "elapsed_s": time.monotonic() - started,
            })  # fmt: skip
            if trainer.completed == config.sft_warmup_steps and config.sft_warmup_steps:
                record["after_sft"] = _summary(trainer.evaluate(trainer.completed, name="after_sft"))
            save()
        record["train_s"] = time.monotonic() - started
        record["after"] = _summary(trainer.evaluate(trainer.completed or 0, name="after"))
        trainer.export(run_dir / "policy")
        save()
    finally:
        trainer.close()


def plot(records: list[dict[str, Any]], path: Path, minutes: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve, bars) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    colors_used = []
    for record in records:
        # SFT steps play the expert, not the policy: their rewards are not the policy's and stay off the curve.
        steps = [s for s in record["steps"] if s["phase"] != "sft"]
        xs = [s["step"] for s in steps]
        ys = [s["reward"] for s in steps]
        line = curve.plot(xs, ys, marker=".", alpha=0.35, label=f"{record['arm']} (per step)")[0]
        colors_used.append(line.get_color())
        window = 5  # a trailing mean: each step has only tasks_per_step x group_size episodes
        trailing = [ys[max(0, i - window + 1) : i + 1] for i in range(len(ys))]
        smooth = [sum(part) / len(part) for part in trailing]
        curve.plot(xs, smooth, color=line.get_color(), label=f"{record['arm']} (mean of last {window})")
        sft = [s["step"] for s in record["steps"] if s["phase"] == "sft"]
        if sft:
            curve.axvspan(
                0.5, max(sft) + 0.5, color=line.get_color(), alpha=0.08, label=f"{record['arm']}: SFT on expert"
            )
    curve.set_xlabel("training step")
    curve.set_ylabel("mean sampled reward (temperature 1)")
    curve.set_ylim(-0.05, 1.05)
    curve.set_title(f"SmolLM2-135M LoRA GRPO on `price`, {minutes:g} min per arm")
    curve.legend(fontsize=8)
    names, values, errors, colors = [], [], [], []
    for record, color in zip(records, colors_used, strict=True):
        for stage in ("before", "after_sft", "after"):
            if stage in record:
                summary = record[stage]
                value = summary["success_rate"]
                low, high = summary["success_ci"]
                names.append(f"{record['arm']}\n{stage}")
                values.append(value)
                errors.append([value - (value if low is None else low), (value if high is None else high) - value])
                colors.append(color)
    bars.bar(range(len(values)), values, yerr=list(zip(*errors, strict=True)), capsize=3, color=colors)
    bars.set_xticks(range(len(values)), names, fontsize=7)
    bars.set_ylim(0, 1.05)
    bars.set_title(f"greedy success, {records[0]['config']['eval_tasks']} held-out tasks (95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="training wall-clock budget per arm")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {ARMS}")
    ap.add_argument("--sft-steps", type=int, default=3, help="expert SFT steps of the sft+grpo arm")
    ap.add_argument("--eval-tasks", type=int, default=32, help="held-out tasks per greedy evaluation")
    ap.add_argument("--max-steps", type=int, default=10_000, help="step cap (the budget normally ends the run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--run-dir", default="runs/learning_curve")
    ap.add_argument("--out", default=str(ROOT / "docs" / "learning_curve.png"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads per arm (0: CPUs / arms)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the JSON next to --out")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        ap.error(f"--arms: unknown {unknown}; choose from {ARMS}")
    if args.minutes <= 0 or args.sft_steps < 1 or args.eval_tasks < 1:
        ap.error("--minutes must be > 0, --sft-steps and --eval-tasks >= 1")
    if args.child:
        run_arm(args.child, Path(args.child_out), args)
        return
    out = Path(args.out)
    if args.plot_only:
        plot(json.loads(out.with_suffix(".json").read_text())["arms"], out, args.minutes)
        return
    threads = args.threads or max(1, (os.cpu_count() or 1) // len(arms))
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    children = []
    for arm in arms:
        record_path = Path(args.run_dir) / f"{arm.replace('+', '_')}.json"
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", arm, "--child-out", str(record_path),
               "--threads", str(threads)]  # fmt: skip
        log = open(Path(args.run_dir) / f"{arm.replace('+', '_')}.log", "w")  # noqa: SIM115 - outlives this block
        children.append((arm, record_path, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    print(f"{len(arms)} arm(s), {args.minutes:g} min each, {threads} thread(s) each; logs in {args.run_dir}/")
    failed = []
    for arm, _, process, log in children:
        if process.wait() != 0:
            failed.append(arm)
        log.close()
    if failed:
        sys.exit(f"arm(s) {failed} failed; see {args.run_dir}/<arm>.log")
    records = [json.loads(path.read_text()) for _, path, _, _ in children]
    plot(records, out, args.minutes)
    data = {
        "command": " ".join(["python", "experiments_curve.py", *sys.argv[1:]]),
        "load_average_at_end": os.getloadavg(),
        "arms": records,
    }
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    print(f"{'arm':10} {'steps':>5} {'before':>7} {'after SFT':>9} {'after':>6}  RL reward first 5 -> last 5 steps")
    for record in records:
        rewards = [s["reward"] for s in record["steps"] if s["phase"] != "sft"]
        head, tail = rewards[:5], rewards[-5:]
        after_sft = record.get("after_sft", {}).get("success_rate")
        print(
            f"{record['arm']:10} {len(record['steps']):5d} {record['before']['success_rate']:7.2f} "
            f"{'-' if after_sft is None else f'{after_sft:.2f}':>9} {record['after']['success_rate']:6.2f}  "
            f"{sum(head) / max(len(head), 1):.2f} -> {sum(tail) / max(len(tail), 1):.2f}"
        )
    print(f"plot: {out}; numbers: {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
