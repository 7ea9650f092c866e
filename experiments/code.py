"""Code RL learning recipe (issue 22 item 1): does GRPO teach SmolLM2-135M bug kinds its SFT warm start never
showed, on packages it never saw?

Not run in CI. Same protocol as tool_use.py and search.py, one seed's run in RUN_DIR/seed_N/, every stage a
normal ``Trainer`` run on the ``code-bugs`` env (bubblewrap sandbox, copy-on-write workspaces, hidden tests):
0. Data (code_tasks.py): bugs mined by ``taskrl datagen codebugs`` from seven real sdists, stored in
   experiments/data/code/ (commands in its README). Training packages and held-out packages share
   nothing (checked before any run). Tasks are localised (``hint_lines``): the prompt names the file and a
   window of lines around the bug, so an episode is read window -> edit -> run tests -> report, short enough
   for a 2-core CPU.
1. ``sft``: LoRA behaviour cloning of the env's expert (read the window, apply the reverse of the recorded
   mutation, run the tests, report) on the training packages' **demonstration kinds** (flipped comparisons,
   swapped operators, off-by-one constants, swapped and/or), merged into the base: the common start of both
   arms, evaluated here ("start").
2. Two arms from that checkpoint at once, one torch thread each, ``--minutes`` of training wall-clock each:
   ``sft_only`` keeps cloning those demonstrations; ``grpo`` runs GRPO on the training packages' **RL kinds**
   (dropped statements, negated conditions, dropped negations, swapped arguments: no demonstration shows
   them), rewarded by the env's hidden tests (share of fail-to-pass times share of pass-to-pass tests passing;
   tampering with tests or configs scores 0).
3. Held-out evaluation of each arm on every bug of the held-out packages (all kinds): greedy success (hidden
   tests all pass) and sampled success (T=1, pass@1 over 4 samples) with percentile-bootstrap CIs over tasks,
   success per kind group, tool calls, edits, invalid-call rate; and the hack flags (tampering, no edit,
   clarifying question, tests that failed to run) of every GRPO-arm episode, training and evaluation, with a
   check that no flagged episode scored above a failure.

``--design`` (code_tasks.DESIGNS): ``edit_file`` (the default, the first two runs: edit by exact text) or
``lines`` (edit by line number with ``replace_lines``; GRPO's reward adds 0.1 x the share of valid tool calls,
tamper-gated and logged apart; success and the evaluation reward stay "every hidden test passes") or
``pinpoint`` (``lines``, but the prompt names the lines to replace, 2 turns, and GRPO trains on every bug kind
of the training packages, demonstrated or not; the held-out packages and success are unchanged) or
``pinpoint_strict`` (``pinpoint`` with a valid-call credit that calls which fail at run time do not earn).

Writes docs/learning_code.{json,png} (another design: docs/learning_code_<design>.*). ``--resume`` continues an
interrupted seed from its checkpoints. ``--pilot`` runs every stage at toy size into runs/learning_code_pilot
(another design: runs/learning_code_<design>_pilot), a smoke test of the whole pipeline.

    python experiments/code.py --seed 0 --minutes 10 [--design pinpoint_strict] [--resume] [--pilot]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # experiments.*, from any working directory
from experiments.code_tasks import (  # noqa: E402
    DEMO_KINDS,
    DESIGNS,
    RL_KINDS,
    env_kwargs,
    episode_row,
    flag_report,
    group_variance,
    kind_group,
    split_report,
)
from experiments.common import fresh_dirs, run_arm, run_sft, run_stages, save_seed  # noqa: E402
from experiments.tool_use import cpu_model, fmt, paired_delta, summary  # noqa: E402

ARMS = ("sft_only", "grpo")
STEP_KEYS = ("rewards/total", "rewards/std", "rewards/tests", "rewards/valid_tool_use", "tools/tool_calls",
             "tools/invalid_tool_calls",
             "losses/entropy", "losses/sft_nll", "losses/policy_loss", "charts/groups", "charts/dropped_groups",
             "charts/step_time_s")  # fmt: skip
PILOT = {"sft_steps": 2, "sft_tasks": 2, "tasks": 1, "group_size": 2, "eval_tasks": 3, "sampled_tasks": 2,
         "curve_points": 0, "minutes": 0.5}  # fmt: skip
"""--pilot: every stage at toy size (about five minutes on this machine)."""


def stage_config(stage: str, run_dir: Path, start: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig of ``sft`` (the warm start), ``sft_only`` or ``grpo``; arms start from ``start``."""
    config = {
        "finetune": "lora", "lora.rank": 16, "lora.alpha": 32.0, "rollout.max_turns": args.max_turns,
        "rollout.max_new_tokens": args.max_new_tokens, "rollout.max_context_tokens": args.context,
        "rollout.temperature": 1.0,
        "device": args.device, "dtype": args.dtype, "seed": args.seed, "progress": False, "env": "code-bugs",
        "split": "all", "run_dir": str(run_dir), "resume": True, "rollout.concurrency": args.concurrency,
    }  # fmt: skip
    sft = {"algo.name": "sft", "sft_data": "expert", "lr": args.sft_lr,
           "env_kwargs": env_kwargs("sft", args.hint_lines, args.design),
           "rollout.tasks_per_step": args.sft_tasks, "rollout.group_size": 1}  # fmt: skip
    if stage == "sft":
        return {**config, **sft, "seed": args.sft_seed, "model": "smollm2", "steps": args.sft_steps,
                "checkpoint_every": 0}  # fmt: skip
    assert start is not None
    config.update({"model": str(start), "steps": args.max_steps, "checkpoint_every": 1})
    if args.micro_batch_tokens:  # the arms only: the warm start's config (and so its checkpoint) stays as it was
        config["micro_batch_tokens"] = args.micro_batch_tokens
    if stage == "sft_only":
        return {**config, **sft}
    return {**config, "algo.name": "grpo", "lr": args.lr, "env_kwargs": env_kwargs("rl", args.hint_lines, args.design),
            "rollout.tasks_per_step": args.tasks, "rollout.group_size": args.group_size,
            "entropy_coef": args.entropy_coef,
            "algo.normalize_std": True}  # fmt: skip


def eval_tasks(n: int, args: argparse.Namespace) -> list[Any]:
    """The first ``n`` held-out tasks, alternating packages (so a prefix covers each)."""
    from taskrl.env import make

    tasks = list(make("code-bugs", **env_kwargs("eval", args.hint_lines, args.design)).tasks("all"))
    by_package: dict[str, list[Any]] = {}
    for task in tasks:
        by_package.setdefault(task.id.split("/")[0], []).append(task)
    queues = list(by_package.values())
    mixed = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    return mixed[:n]


def held_out(trainer: Any, name: str, args: argparse.Namespace, *, n: int, sampled: bool) -> dict[str, Any]:
    """Greedy (or T=1, 4 samples) episodes of the trainer's current weights on held-out packages' bugs."""
    from taskrl.env import make
    from taskrl.eval import EvalConfig, evaluate

    config = EvalConfig(
        samples_per_task=4 if sampled else 1, temperature=1.0 if sampled else 0.0, max_turns=args.max_turns,
        max_context_tokens=args.context, max_new_tokens=args.max_new_tokens, concurrency=args.concurrency,
        seed=args.seed,
    )  # fmt: skip
    tasks = eval_tasks(n, args)
    kwargs = env_kwargs("eval", args.hint_lines, args.design)
    rows: list[dict[str, Any]] = []
    # No run log: every episode passes through on_trajectory (a resumed evaluation would skip finished ones).
    job = evaluate(lambda: make("code-bugs", **kwargs), {"policy": trainer.learner_policy}, tasks, config, name=name,
                   on_trajectory=lambda _, traj: rows.append(episode_row(traj)))  # fmt: skip
    result = summary(trainer.rollouts.run(job))
    with (trainer.run.dir / f"{name}_episodes.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    kinds = {t.id: t.info["mutation"] for t in tasks}
    per_group = {}
    for group in ("demo_kinds", "rl_kinds"):
        ids = [t.id for t in tasks if kind_group(kinds[t.id]) == group]
        picked = [r for r in rows if r["task_id"] in ids]
        per_group[group] = {"tasks": len(ids), "success": sum(r["success"] for r in picked) / max(len(picked), 1)}
    calls = sum(r["tool_calls"] for r in rows)
    result.update({
        "success_by_kind_group": per_group,
        "edits": sum(r["edits"] for r in rows) / max(len(rows), 1),
        "invalid_call_rate": sum(r["invalid_tool_calls"] for r in rows) / calls if calls else None,
        "mean_tests_passed": sum(r["tests_passed"] for r in rows) / max(len(rows), 1),
        "flags": flag_report(rows),
    })  # fmt: skip
    return result


def final_evals(trainer: Any, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "greedy": held_out(trainer, "heldout_greedy", args, n=args.eval_tasks, sampled=False),
        "sampled": held_out(trainer, "heldout_sampled", args, n=args.sampled_tasks, sampled=True),
    }


def training_episodes(arm_dir: Path) -> list[dict[str, Any]]:
    """Every training episode an arm's Trainer logged (run_dir/trajectories/train_*.jsonl), as episode rows."""
    from taskrl.runlog import read_trajectories

    return [{"step": step, **episode_row(t)} for step, trajs in sorted(read_trajectories(arm_dir).items())
            for t in trajs]  # fmt: skip


def seed_result(seed_dir: Path, sft_dir: Path, args: argparse.Namespace, command: str) -> dict[str, Any]:
    """One seed's results: start, both arms, grpo - sft_only paired over tasks, and the GRPO arm's hack flags."""
    start = json.loads((sft_dir / "start.json").read_text())
    arms = {arm: json.loads((seed_dir / f"{arm}.json").read_text()) for arm in ARMS}
    deltas = {
        kind: paired_delta(arms["sft_only"]["final"][kind]["per_task"], arms["grpo"]["final"][kind]["per_task"],
                           args.seed)
        for kind in ("greedy", "sampled")
    }  # fmt: skip
    for arm, record in arms.items():
        alerts = seed_dir / arm / "alerts.jsonl"
        rows = [json.loads(line) for line in alerts.read_text().splitlines()] if alerts.exists() else []
        record["alerts"] = {m: sum(r["monitor"] == m for r in rows) for m in sorted({r["monitor"] for r in rows})}
    train_rows = training_episodes(seed_dir / "grpo")
    eval_rows = [json.loads(line) for name in ("heldout_greedy", "heldout_sampled")
                 for line in (seed_dir / "grpo" / f"{name}_episodes.jsonl").read_text().splitlines()]  # fmt: skip
    hacks = {"training": flag_report(train_rows), "evaluation": flag_report(eval_rows),
             "flagged_training_episodes": [r for r in train_rows if r["flagged"]][:50]}  # fmt: skip
    return {"seed": args.seed, "sft_seed": args.sft_seed, "minutes": args.minutes, "command": command,
            "design": DESIGNS[args.design]["plot"], "code_design": args.design,
            "grpo_group_variance": group_variance(train_rows), "cpu": cpu_model(),
            "load_average_at_end": os.getloadavg(),
            "data": split_report(args.hint_lines, args.design), "start": start, "arms": arms,
            "grpo_minus_sft_only": deltas,
            "grpo_hack_flags": hacks}  # fmt: skip


def line(name: str, steps: str, final: dict[str, Any]) -> str:
    g, s = final["greedy"], final["sampled"]
    groups = g["success_by_kind_group"]
    invalid = g["invalid_call_rate"]
    return (f"{name:9} {steps:>5}  greedy {fmt(g['success']):18} (demo kinds {groups['demo_kinds']['success']:.2f}, "
            f"RL kinds {groups['rl_kinds']['success']:.2f})  T=1 pass@1 {fmt(s['pass@1']):18} tests passed "
            f"{g['mean_tests_passed']:.2f}  calls/ep {g['tool_calls']:.2f}  edits/ep {g['edits']:.2f}  invalid "
            f"{'-' if invalid is None else f'{invalid:.2f}'}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the arms (task order, sampling)")
    ap.add_argument("--sft-seed", type=int, default=0, help="seed of the warm start (shared by --seed runs)")
    ap.add_argument("--redo-sft", action="store_true", help="remake the warm start even if one exists")
    ap.add_argument(
        "--design",
        choices=sorted(DESIGNS),
        default="edit_file",
        help="; ".join(f"{name}: {d['about']}" for name, d in DESIGNS.items()),
    )
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--minutes", type=float, default=10.0, help="training wall-clock budget per arm")
    ap.add_argument("--resume", action="store_true", help="continue this seed's run directory")
    ap.add_argument("--pilot", action="store_true", help="every stage at toy size, into runs/learning_code_pilot")
    ap.add_argument("--sft-steps", type=int, default=8, help="SFT steps of the common warm start")
    ap.add_argument("--sft-tasks", type=int, default=6, help="expert episodes per SFT step")
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate")
    ap.add_argument("--tasks", type=int, default=2, help="GRPO tasks per step")
    ap.add_argument("--group-size", type=int, default=4, help="GRPO samples per task")
    ap.add_argument("--entropy-coef", type=float, default=0.0)
    ap.add_argument("--hint-lines", type=int, default=None,
                    help="lines either side of the bug the prompt names (default: the design's, 6 before pinpoint)")
    ap.add_argument("--max-turns", type=int, default=None,
                    help="turns per episode (default: the design's; 3 = read, edit, run the tests: the reward needs "
                         "no report)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=2048, help="context tokens per episode")
    ap.add_argument("--concurrency", type=int, default=8, help="episodes played at once (each runs pytest)")
    ap.add_argument("--eval-tasks", type=int, default=32, help="held-out tasks, greedy (0: every one)")
    ap.add_argument("--sampled-tasks", type=int, default=8, help="held-out tasks of the T=1 x 4 evaluation")
    ap.add_argument("--curve-tasks", type=int, default=8, help="held-out tasks of each curve point (greedy)")
    ap.add_argument("--curve-points", type=int, default=1, help="curve evaluations during training")
    ap.add_argument("--max-steps", type=int, default=10_000, help="step cap (the budget normally ends a run)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--run-dir", default=None, help="default: runs/learning_code (--pilot: runs/learning_code_pilot)")
    ap.add_argument("--out", default=None, help="plot path (default docs/learning_code.png; --pilot: in run dir)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the JSON next to --out")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=0,
        help="the arms' learner token budget per forward/backward (0: TrainConfig's); bounds memory",
    )
    ap.add_argument("--sft-threads", type=int, default=0, help="torch threads of the warm start (0: --threads)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for key, default in (("hint_lines", 6), ("max_turns", 3)):
        if getattr(args, key) is None:
            setattr(args, key, DESIGNS[args.design].get(key, default))
    if args.pilot:
        for key, value in PILOT.items():
            setattr(args, key, value)
    if args.minutes <= 0 or min(args.sft_steps, args.sampled_tasks, args.curve_tasks) < 1 or args.group_size < 2:
        ap.error("--minutes must be > 0; --sft-steps, --sampled-tasks, --curve-tasks >= 1; --group-size >= 2")
    name = "learning_code" if args.design == "edit_file" else f"learning_code_{args.design}"
    run_dir = Path(args.run_dir or (f"runs/{name}_pilot" if args.pilot else f"runs/{name}"))
    out = Path(args.out or (run_dir / f"{name}.png" if args.pilot else ROOT / "docs" / f"{name}.png"))
    data_path = out.with_suffix(".json")
    from experiments.plots import plot_tool_use

    if args.plot_only:
        return plot_tool_use(json.loads(data_path.read_text()), out)
    split = split_report(args.hint_lines, args.design)  # refuses a split that shares a package, an sdist or a task
    args.eval_tasks = args.eval_tasks or split["tasks"]["eval"]
    seed_dir, sft_dir = run_dir / f"seed_{args.seed}", run_dir / f"sft_seed_{args.sft_seed}"
    if args.child == "sft":
        return run_sft(sft_dir, args, stage_config=stage_config,
                       start_evals=lambda trainer: final_evals(trainer, args))  # fmt: skip
    if args.child in ARMS:
        return run_arm(args.child, seed_dir, sft_dir / "start", args, stage_config=stage_config, held_out=held_out,
                       final_evals=final_evals, step_keys=STEP_KEYS)  # fmt: skip
    print(f"data: {split['tasks']} tasks; train packages {split['packages']['train']}, held-out "
          f"{split['packages']['eval']}; demo kinds {list(DEMO_KINDS)}, RL kinds {list(RL_KINDS)}")  # fmt: skip
    fresh_dirs(seed_dir, sft_dir, args)
    command = " ".join(["python", "experiments/code.py", *sys.argv[1:]])
    (seed_dir / "commands.txt").open("a").write(command + "\n")
    began = time.monotonic()
    run_stages(__file__, ["sft"], sft_dir, threads=args.sft_threads or args.threads)
    start = json.loads((sft_dir / "start.json").read_text())
    print(f"SFT {start['sft_steps']} steps in {start['sft_s']:.0f}s, nll {start['sft_nll']}")
    print(line("start", "-", start))
    run_stages(__file__, ARMS, seed_dir, threads=args.threads)
    result = seed_result(seed_dir, sft_dir, args, command)
    result["wall_s"] = time.monotonic() - began
    data = save_seed(data_path, args.seed, result)
    plot_tool_use(data, out)
    print(line("start", "-", start))
    for arm, record in result["arms"].items():
        print(line(arm, str(len(record["steps"])), record["final"]))
    for kind, delta in result["grpo_minus_sft_only"].items():
        print(f"grpo - sft_only {kind} success (paired over tasks): {fmt(delta)}")
    hacks = result["grpo_hack_flags"]
    for where in ("training", "evaluation"):
        print(f"grpo {where} episodes: {hacks[where]}")
    print(f"grpo training groups: {result['grpo_group_variance']}")
    print(f"plot: {out}; numbers: {data_path}")
    if not all(hacks[where]["flagged_never_beat_failure"] for where in ("training", "evaluation")):
        sys.exit("a GRPO-arm episode flagged for tampering scored above a failure: see grpo_hack_flags")
    return None


if __name__ == "__main__":
    main()
