"""Swarm learning recipe (issue 14, Kimi K2.5 PARL): does GRPO teach a SmolLM2-135M orchestrator a fan-out its
SFT warm start never showed?

Not run in CI. Same protocol as tool_use.py and search.py, one seed's run in RUN_DIR/seed_N/, every stage a normal
``Trainer`` on the ``swarm`` env (the orchestrator trains; it has ``create_subagent``/``assign_task``). The
sub-agents are frozen and scripted, as in benchmarks/swarm_bench.py: the ``search`` env's own rule (search every
clue, then answer) over the default corpus, run concurrently by the env's asyncio runtime; only the orchestrator's
tokens are sampled and trained, so the item F1 measures orchestration (delegating every row with a faithful
copy of its question, and the answer table), not searching.
0. Data (swarm_tasks.py, once): verified single-hop rows split by document; 1-2 row tasks for the
   demonstrations, 3-row tasks for GRPO, held-out 3-row tasks of rows sharing no document, quote or question
   with any training row.
1. ``sft``: LoRA behaviour cloning of the env's fan-out expert (``scripted_rule``: one helper per row, all in one
   turn, written row by row: create row k's helper, assign it row k; then the table) on the **1-2 row** tasks,
   merged into the base: the common start of both arms, evaluated here ("start").
2. Two arms from that checkpoint at once, one torch thread each, ``--minutes`` of training wall-clock each:
   ``sft_only`` keeps cloning the 1-2 row demonstrations; ``grpo`` runs GRPO on **3-row** tasks with the env's
   ``parl`` reward (item F1 + λ1·r_parallel + λ2·r_finish annealed to 0 over ``--anneal-steps`` + λ3·r_efficiency
   on critical steps), so a sample that covers one row more, or in one turn fewer, is worth more than its group.
3. Held-out evaluation of each arm: greedy and sampled (T=1, 4 samples per task) orchestrator item F1, all rows
   right, critical steps, invalid-call rate, sub-agents created / finished / unfinished (created but never
   returning an answer) per episode, with percentile-bootstrap CIs over tasks; greedy curve points in training.

Writes docs/learning_swarm.{json,png}. ``--resume`` continues an interrupted seed from its checkpoints.
``--pilot`` runs every stage tiny (2 SFT steps, 1.5 minutes per arm, 4 held-out tasks) into runs/ only.

    python experiments/swarm.py --seed 0 --minutes 30 --sft-threads 2 [--resume] [--pilot]
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
from experiments.common import fresh_dirs, run_arm, run_sft, run_stages, save_seed, summarise  # noqa: E402
from experiments.tool_use import cpu_model, fmt, paired_delta  # noqa: E402

ARMS = ("sft_only", "grpo")
METRICS = ("item_f1", "all_correct", "item_recall", "critical_steps", "invalid_rate", "invalid_tool_calls",
           "tool_calls", "subagents_created", "subagents_finished", "subagents_unfinished", "assignments",
           "max_concurrency", "turns")  # fmt: skip
DELTA_KEYS = ("item_f1", "all_correct", "critical_steps", "invalid_rate", "subagents_unfinished")
STEP_KEYS = ("rewards/total", "rewards/std", "rewards/perf", "rewards/parallel", "rewards/finish",
             "rewards/efficiency", "tools/tool_calls", "tools/invalid_tool_calls", "losses/entropy", "losses/sft_nll",
             "losses/policy_loss", "charts/groups", "charts/dropped_groups", "charts/step_time_s")  # fmt: skip
PILOT = {"sft_steps": 2, "sft_tasks": 4, "minutes": 1.5, "eval_tasks": 4, "sampled_tasks": 2, "curve_tasks": 2,
         "curve_points": 0, "run_dir": "runs/learning_swarm_pilot",
         "out": "runs/learning_swarm_pilot/learning_swarm_pilot.png"}  # fmt: skip
"""What ``--pilot`` overrides: every stage end to end in a few minutes, nothing written under docs/."""


def env_kwargs(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The swarm env on one of the recipe's task files (sft, rl or eval), frozen scripted sub-agents."""
    reward = {"lambda_parallel": 0.3, "lambda_finish": 0.2, "lambda_efficiency": 0.1, "k": 3,
              "critical_steps_budget": args.critical_budget, "anneal_steps": args.anneal_steps}  # fmt: skip
    return {"tasks": args.data["files"][name], "subagent_policy": "scripted", "orchestrator_max_steps": args.max_turns,
            "subagent_max_steps": 4, "max_subagents": 6, "reward": reward}  # fmt: skip


def stage_config(stage: str, run_dir: Path, start: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig of ``sft`` (the warm start), ``sft_only`` or ``grpo``; arms start from ``start``."""
    config = {
        "finetune": "lora", "lora.rank": 16, "lora.alpha": 32.0, "rollout.max_turns": args.max_turns,
        "rollout.max_new_tokens": args.max_new_tokens, "rollout.max_context_tokens": args.context,
        "rollout.temperature": 1.0,
        "device": args.device, "dtype": args.dtype, "learner_precision": args.learner_precision, "seed": args.seed,
        "progress": False, "env": "swarm", "split": "train", "run_dir": str(run_dir), "resume": True,
    }  # fmt: skip
    if args.micro_batch_tokens:  # peak memory of forward/backward (same math); 0: the trainer's default
        config["micro_batch_tokens"] = args.micro_batch_tokens
    sft = {"algo.name": "sft", "sft_data": "expert", "lr": args.sft_lr, "env_kwargs": env_kwargs("sft", args),
           "rollout.tasks_per_step": args.sft_tasks, "rollout.group_size": 1}  # fmt: skip
    if stage == "sft":
        # A checkpoint per step: a warm start killed half-way (a shared machine) resumes, and one cut short by the
        # clock ends at the steps done by rerunning with a smaller --sft-steps (``steps`` may change on resume).
        return {**config, **sft, "seed": args.sft_seed, "model": "smollm2", "steps": args.sft_steps,
                "checkpoint_every": 1}  # fmt: skip
    assert start is not None
    # Two arms share the machine: at most half the default forward/backward token budget (peak memory), same math.
    micro = min(args.micro_batch_tokens or 2048, 2048)
    config.update({"model": str(start), "steps": args.max_steps, "checkpoint_every": 1, "micro_batch_tokens": micro})
    if stage == "sft_only":
        return {**config, **sft}
    return {**config, "algo.name": "grpo", "lr": args.lr, "env_kwargs": env_kwargs("rl", args),
            "rollout.tasks_per_step": args.tasks,
            "rollout.group_size": args.group_size, "entropy_coef": args.entropy_coef,
            "algo.normalize_std": True}  # fmt: skip


def eval_tasks(n: int, args: argparse.Namespace) -> list[Any]:
    from taskrl.types import read_tasks

    return read_tasks(args.data["files"]["eval"])[:n]


def episode_row(traj: Any) -> dict[str, Any]:
    """One held-out episode's numbers; a sub-agent is unfinished when no assignment of it returned an answer."""
    m = traj.metrics
    finished = {c.info.get("agent_id") for c in traj.children if (c.final_answer or "").strip()}
    created = m.get("swarm/subagents_created", 0.0)
    invalid, calls = m.get("invalid_tool_calls", 0.0), m.get("tool_calls", 0.0)
    return {
        "task_id": traj.task_id, "reward": traj.reward, "error": traj.error,
        "item_f1": m.get("swarm/item_f1", 0.0), "all_correct": m.get("swarm/all_correct", 0.0),
        "item_recall": m.get("swarm/item_recall", 0.0), "critical_steps": m.get("critical_steps", 0.0),
        "invalid_tool_calls": invalid, "tool_calls": calls, "invalid_rate": invalid / max(calls, invalid, 1.0),
        "subagents_created": created, "subagents_finished": float(len(finished)),
        "subagents_unfinished": max(0.0, created - len(finished)), "assignments": m.get("swarm/assignments", 0.0),
        "max_concurrency": m.get("swarm/max_concurrency", 0.0), "turns": m.get("turns", 0.0),
        "final_answer": (traj.final_answer or "")[:300],
    }  # fmt: skip


def held_out(trainer: Any, name: str, args: argparse.Namespace, *, n: int, sampled: bool) -> dict[str, Any]:
    """Greedy (or T=1, 4 samples) episodes of the trainer's current weights on held-out 3-row tasks."""
    from taskrl.env import make
    from taskrl.eval import EvalConfig, evaluate

    config = EvalConfig(
        samples_per_task=4 if sampled else 1, temperature=1.0 if sampled else 0.0, max_turns=args.max_turns,
        max_context_tokens=args.context, max_new_tokens=args.max_new_tokens, concurrency=args.eval_concurrency,
        seed=args.seed,
    )  # fmt: skip
    tasks = eval_tasks(n, args)
    ids = [t.id for t in tasks]
    episodes = trainer.run.dir / f"{name}_episodes.jsonl"
    if episodes.exists():  # a finished evaluation of these weights (a resumed run): summarised again, not replayed
        rows = [r for r in map(json.loads, episodes.read_text().splitlines()) if r["task_id"] in set(ids)]
        if len(rows) == len(tasks) * config.samples_per_task:
            return {**summarise(rows, ids, METRICS, args.seed), "wall_time_s": None}
    kwargs = env_kwargs("eval", args)
    rows = []
    job = evaluate(lambda: make("swarm", **kwargs), {"policy": trainer.learner_policy}, tasks, config, name=name,
                   on_trajectory=lambda _, traj: rows.append(episode_row(traj)))  # fmt: skip
    result = trainer.rollouts.run(job)
    with episodes.open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return {**summarise(rows, ids, METRICS, args.seed), "wall_time_s": result["wall_time_s"]}


def final_evals(trainer: Any, args: argparse.Namespace, *, sampled: bool = True) -> dict[str, Any]:
    """Greedy on ``--eval-tasks`` held-out tasks; T=1 x 4 on the first ``--sampled-tasks`` of them."""
    out = {"greedy": held_out(trainer, "heldout_greedy", args, n=args.eval_tasks, sampled=False)}
    if sampled:
        out["sampled"] = held_out(trainer, "heldout_sampled", args, n=args.sampled_tasks, sampled=True)
    return out


def seed_result(seed_dir: Path, sft_dir: Path, args: argparse.Namespace, command: str) -> dict[str, Any]:
    """One seed's results: start, both arms, and grpo - sft_only paired over tasks, per metric and kind."""
    start = json.loads((sft_dir / "start.json").read_text())
    arms = {arm: json.loads((seed_dir / f"{arm}.json").read_text()) for arm in ARMS}
    deltas = {
        kind: {key: paired_delta(arms["sft_only"]["final"][kind]["per_task"][key],
                                 arms["grpo"]["final"][kind]["per_task"][key], args.seed) for key in DELTA_KEYS}
        for kind in ("greedy", "sampled")
    }  # fmt: skip
    for arm, record in arms.items():
        alerts = seed_dir / arm / "alerts.jsonl"
        rows = [json.loads(line) for line in alerts.read_text().splitlines()] if alerts.exists() else []
        record["alerts"] = {m: sum(r["monitor"] == m for r in rows) for m in sorted({r["monitor"] for r in rows})}
    data = {k: v for k, v in args.data.items() if k in ("counts", "rows", "overlaps")}
    return {"seed": args.seed, "sft_seed": args.sft_seed, "minutes": args.minutes, "command": command,
            "cpu": cpu_model(), "load_average_at_end": os.getloadavg(), "data": data, "start": start,
            "arms": arms, "grpo_minus_sft_only": deltas}  # fmt: skip


def line(name: str, steps: str, final: dict[str, Any]) -> str:
    g, s = final["greedy"], final.get("sampled")
    sampled = f" | T=1 F1 {fmt(s['item_f1'])} invalid {s['invalid_rate']['value']:.2f}" if s else ""
    return (f"{name:9} {steps:>5}  F1 {fmt(g['item_f1']):18} all-right {fmt(g['all_correct']):18} critical "
            f"{g['critical_steps']['value']:.2f} invalid {g['invalid_rate']['value']:.2f} sub-agents created "
            f"{g['subagents_created']['value']:.2f} finished {g['subagents_finished']['value']:.2f} unfinished "
            f"{g['subagents_unfinished']['value']:.2f}{sampled}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the arms (task order, sampling)")
    ap.add_argument("--sft-seed", type=int, default=0, help="seed of the warm start (shared by --seed runs)")
    ap.add_argument("--redo-sft", action="store_true", help="remake the warm start even if one exists")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--learner-precision", default="float32", help="float32, bfloat16 or auto (TrainConfig field)")
    ap.add_argument("--minutes", type=float, default=30.0, help="training wall-clock budget per arm")
    ap.add_argument("--resume", action="store_true", help="continue this seed's run directory")
    ap.add_argument("--pilot", action="store_true", help="every stage tiny, into runs/ only (see PILOT)")
    ap.add_argument("--sft-steps", type=int, default=12, help="SFT steps of the common warm start")
    ap.add_argument("--sft-tasks", type=int, default=8, help="expert episodes per SFT step")
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate")
    ap.add_argument("--tasks", type=int, default=2, help="GRPO tasks per step")
    ap.add_argument("--group-size", type=int, default=4, help="GRPO samples per task")
    ap.add_argument("--entropy-coef", type=float, default=0.0)
    ap.add_argument("--anneal-steps", type=int, default=10, help="GRPO steps over which λ1, λ2 go to 0")
    ap.add_argument("--critical-budget", type=int, default=12, help="critical steps at which r_efficiency is 0")
    ap.add_argument("--max-turns", type=int, default=3, help="orchestrator turns per episode")
    ap.add_argument("--max-new-tokens", type=int, default=576, help="the expert's 3-row fan-out turn: 420-490 tokens")
    ap.add_argument("--context", type=int, default=2048, help="orchestrator context tokens")
    ap.add_argument("--eval-tasks", type=int, default=24, help="held-out tasks of the final greedy evaluation")
    ap.add_argument("--sampled-tasks", type=int, default=8, help="held-out tasks of the T=1 x 4 evaluation")
    ap.add_argument(
        "--eval-concurrency",
        type=int,
        default=8,
        help="held-out episodes at once (peak memory: 16 reached 6-6.6 GB per arm)",
    )
    ap.add_argument("--start-sampled", action="store_true", help="also evaluate the warm start at T=1")
    ap.add_argument("--curve-tasks", type=int, default=8, help="held-out tasks of each curve point (greedy)")
    ap.add_argument("--curve-points", type=int, default=1, help="curve evaluations during training")
    ap.add_argument("--max-steps", type=int, default=10_000, help="step cap (the budget normally ends a run)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--run-dir", default="runs/learning_swarm")
    ap.add_argument("--out", default=str(ROOT / "docs" / "learning_swarm.png"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the JSON next to --out")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--sft-threads", type=int, default=0, help="torch threads of the warm start (0: --threads)")
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=0,
        help="forward/backward tokens per micro-batch of every stage (0: default; arms at most 2048)",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pilot:
        vars(args).update(PILOT)
        args.start_sampled = True
    counts = (args.sft_steps, args.eval_tasks, args.sampled_tasks, args.curve_tasks, args.eval_concurrency)
    if args.minutes <= 0 or min(counts) < 1 or args.group_size < 2:
        ap.error(
            "--minutes must be > 0; --sft-steps, --eval-tasks, --curve-tasks, --eval-concurrency >= 1; "
            "--group-size >= 2"
        )
    out = Path(args.out)
    data_path = out.with_suffix(".json")
    from experiments.swarm_plots import plot_swarm

    if args.plot_only:
        return plot_swarm(json.loads(data_path.read_text()), out)
    from experiments.swarm_tasks import prepare

    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    args.data = prepare(run_dir / "data")  # built by the parent before any child starts; children reuse it
    seed_dir, sft_dir = run_dir / f"seed_{args.seed}", run_dir / f"sft_seed_{args.sft_seed}"
    if args.child == "sft":
        return run_sft(sft_dir, args, stage_config=stage_config,
                       start_evals=lambda trainer: final_evals(trainer, args, sampled=args.start_sampled))  # fmt: skip
    if args.child in ARMS:
        return run_arm(args.child, seed_dir, sft_dir / "start", args, stage_config=stage_config, held_out=held_out,
                       final_evals=final_evals, step_keys=STEP_KEYS)  # fmt: skip
    print(f"data: {args.data['counts']} tasks, rows {args.data['rows']}, overlaps {args.data['overlaps']}")
    fresh_dirs(seed_dir, sft_dir, args)
    command = " ".join(["python", "experiments/swarm.py", *sys.argv[1:]])
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
    plot_swarm(data, out)
    print(line("start", "-", start))
    for arm, record in result["arms"].items():
        print(line(arm, str(len(record["steps"])), record["final"]))
    for kind, deltas in result["grpo_minus_sft_only"].items():
        print(f"grpo - sft_only {kind} (paired over tasks): " + ", ".join(f"{k} {fmt(v)}" for k, v in deltas.items()))
    print(f"wall {result['wall_s']:.0f}s; plot: {out}; numbers: {data_path}")
    return None


if __name__ == "__main__":
    main()
