"""Context-1 search learning recipe (issue 14): does GRPO teach SmolLM2-135M multi-hop search its SFT warm
start never showed?

Not run in CI. Same protocol as tool_use.py, one seed's run in RUN_DIR/seed_N/, every stage a normal ``Trainer``.
``--design`` picks the task split (search_tasks.py): ``onehop`` (the first: demonstrations of one-hop questions,
GRPO and evaluation on two-hop ones) or ``hops3`` (the second: demonstrations of one- and two-hop questions, i.e.
one and two searches, GRPO and evaluation on three-hop ones, a third search and a second bridge never shown) or
``hops3b`` (the third: hops3's tasks, with the training-only "prune or answer" note moved from T/2 to the hard
limit in every stage, ``DESIGN_ENV``, so demonstrations answer without a note, as held-out episodes must).
0. Data (search_tasks.py, once): a stdlib pydoc corpus in 128-token chunks; the design's demonstration, GRPO and
   held-out questions, the held-out ones sharing no document, quote, prompt or id with training.
1. ``sft``: LoRA behaviour cloning of the search-only expert on the demonstration questions (search every clue,
   cite the chunks' documents), merged into the base: the common start of both arms, evaluated here ("start").
2. Two arms from that checkpoint at once, one torch thread each, ``--minutes`` of training wall-clock each:
   ``sft_only`` keeps cloning the demonstrations; ``grpo`` runs GRPO on the design's harder questions (search
   every clue and cite every document), rewarded by the env's Context-1 reward (0.7 F-beta + 0.3 trajectory
   recall + answer-found bonus: dense, so groups differ).
3. Held-out evaluation of each arm on the held-out questions: greedy and sampled (T=1, 4 samples per
   task) output recall, F-beta (beta 2, fixed so both arms are scored alike), final-answer-found, full recall
   (every fact's document cited), answer exact, trajectory recall, prune accuracy, context utilisation and
   invalid calls per episode, with percentile-bootstrap CIs over tasks; greedy curve points during training.

Writes docs/learning_search.{json,png} (onehop) or docs/learning_search_<design>.{json,png}. ``--resume``
continues an interrupted seed from its checkpoints.

    python experiments/search.py --design hops3b --seed 0 --minutes 20 [--resume] [--pilot]
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
from experiments.common import fresh_dirs, run_arm, run_sft, run_stages, save_seed  # noqa: E402
from experiments.common import summarise as summarise_metrics  # noqa: E402
from experiments.search_tasks import DESIGNS  # noqa: E402
from experiments.tool_use import cpu_model, fmt, paired_delta  # noqa: E402

ARMS = ("sft_only", "grpo")
REPORT_BETA = 2.0
"""F-beta of the report: the reward's annealed beta, fixed (the reward's own beta moves with each arm's epochs)."""
METRICS = ("output_recall", "f_beta", "answer_found", "full_recall", "answer_correct", "trajectory_recall",
           "output_precision", "context_utilisation", "invalid_tool_calls", "tool_calls", "turns",
           "lists_documents")  # fmt: skip
STEP_KEYS = ("rewards/total", "rewards/std", "rewards/f_beta", "rewards/trajectory_recall", "rewards/answer_found",
             "tools/tool_calls", "tools/invalid_tool_calls", "losses/entropy", "losses/sft_nll",
             "losses/policy_loss", "charts/groups", "charts/dropped_groups", "charts/step_time_s")  # fmt: skip
NO_TEST_SPLIT = 2**32 + 1
"""``test_every`` above every 4-byte id hash but 0: each task file is used whole (the split is by file)."""


DESIGN_ENV: dict[str, dict[str, Any]] = {"hops3b": {"soft_fraction": 0.9}}
"""Env settings a design changes. hops3b: the training-only "prune or answer" note at 0.9 T (the hard limit)
instead of T/2. At T/2 it preceded almost every demonstration's answer (the system prompt and one or two search
results pass T/2 = 1,024 tokens), so the warm start learned to answer after the note, which held-out evaluation
never shows (``training=False``); hops3's warm start then wrote a tool reply instead of an answer."""


def env_kwargs(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The search env on one of the recipe's task files (sft, rl or eval), with the design's env settings."""
    data = args.data
    return {"corpus": data["corpus"], "tasks": data["files"][name], "per_call_budget": args.per_call_budget,
            "context_budget": args.context, "test_every": NO_TEST_SPLIT, "expert_grep": False,
            **DESIGN_ENV.get(args.design, {})}  # fmt: skip


def stage_config(stage: str, run_dir: Path, start: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig of ``sft`` (the warm start), ``sft_only`` or ``grpo``; arms start from ``start``."""
    config = {
        "finetune": "lora", "lora.rank": 16, "lora.alpha": 32.0, "rollout.max_turns": args.max_turns,
        "rollout.max_new_tokens": args.max_new_tokens, "rollout.max_context_tokens": args.context,
        "rollout.temperature": 1.0,
        "device": args.device, "dtype": args.dtype, "learner_precision": args.learner_precision, "seed": args.seed,
        "progress": False, "env": "search", "split": "train", "run_dir": str(run_dir), "resume": True,
    }  # fmt: skip
    if args.micro_batch_tokens:  # peak memory of forward/backward (same math); 0: the trainer's default
        config["micro_batch_tokens"] = args.micro_batch_tokens
    sft = {"algo.name": "sft", "sft_data": "expert", "lr": args.sft_lr, "env_kwargs": env_kwargs("sft", args),
           "rollout.tasks_per_step": args.sft_tasks, "rollout.group_size": 1}  # fmt: skip
    if stage == "sft":
        # A checkpoint per step: a warm start killed half-way (twice OOM-killed on the shared machine) resumes.
        return {**config, **sft, "seed": args.sft_seed, "model": "smollm2", "steps": args.sft_steps,
                "checkpoint_every": 1}  # fmt: skip
    assert start is not None
    # Two arms share a 23 GB machine: at most half the default forward/backward token budget (peak memory).
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
    """One held-out episode's numbers (F-beta recomputed at REPORT_BETA from its precision and recall;
    ``lists_documents``: the final answer has a ``DOCUMENTS:`` list, the format the scorer reads)."""
    from taskrl.envs.search.env import parse_output_docs
    from taskrl.rewards.formulas import f_beta

    m = traj.metrics
    recall, precision = m.get("search/output_recall", 0.0), m.get("search/output_precision", 0.0)
    return {
        "task_id": traj.task_id, "reward": traj.reward, "error": traj.error, "output_recall": recall,
        "output_precision": precision, "f_beta": f_beta(precision, recall, REPORT_BETA),
        "full_recall": float(recall >= 1.0), "answer_found": m.get("search/answer_found", 0.0),
        "answer_correct": m.get("search/answer_correct", 0.0),
        "trajectory_recall": m.get("search/trajectory_recall", 0.0),
        "context_utilisation": m.get("search/context_utilisation", float("nan")),
        "prune_accuracy": m.get("search/prune_accuracy", float("nan")), "pruned": m.get("search/pruned_chunks", 0.0),
        "invalid_tool_calls": m.get("invalid_tool_calls", 0.0), "tool_calls": m.get("tool_calls", 0.0),
        "turns": m.get("turns", 0.0), "lists_documents": float(bool(parse_output_docs(traj.final_answer))),
        "final_answer": (traj.final_answer or "")[:300],
    }  # fmt: skip


def summarise(rows: list[dict[str, Any]], task_ids: list[str], seed: int) -> dict[str, Any]:
    """``common.summarise`` over METRICS, plus pruning pooled over the episodes that pruned."""
    out = summarise_metrics(rows, task_ids, METRICS, seed)
    pruning = [r for r in rows if r["pruned"] > 0]
    out["episodes_pruning"] = len(pruning)
    out["prune_accuracy"] = (sum(r["prune_accuracy"] for r in pruning) / len(pruning)) if pruning else None
    return out


def held_out(trainer: Any, name: str, args: argparse.Namespace, *, n: int, sampled: bool) -> dict[str, Any]:
    """Greedy (or T=1, 4 samples) episodes of the trainer's current weights on the held-out questions."""
    from taskrl.env import make
    from taskrl.eval import EvalConfig, evaluate

    config = EvalConfig(
        samples_per_task=4 if sampled else 1, temperature=1.0 if sampled else 0.0, max_turns=args.max_turns,
        max_context_tokens=args.context, max_new_tokens=args.max_new_tokens, concurrency=args.eval_concurrency,
        seed=args.seed,
    )  # fmt: skip
    tasks = eval_tasks(n, args)
    episodes = trainer.run.dir / f"{name}_episodes.jsonl"
    if episodes.exists():  # a finished evaluation of these weights (a resumed run): summarised again, not replayed
        ids = {t.id for t in tasks}
        rows = [r for r in map(json.loads, episodes.read_text().splitlines()) if r["task_id"] in ids]
        if len(rows) == len(tasks) * config.samples_per_task:
            return {**summarise(rows, [t.id for t in tasks], args.seed), "wall_time_s": None}
    kwargs = env_kwargs("eval", args)
    rows = []
    # No run log: every episode passes through on_trajectory (a resumed evaluation would skip the finished ones).
    job = evaluate(lambda: make("search", **kwargs), {"policy": trainer.learner_policy}, tasks, config, name=name,
                   on_trajectory=lambda _, traj: rows.append(episode_row(traj)))  # fmt: skip
    result = trainer.rollouts.run(job)
    with episodes.open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return {**summarise(rows, [t.id for t in tasks], args.seed), "wall_time_s": result["wall_time_s"]}


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
                                 arms["grpo"]["final"][kind]["per_task"][key], args.seed)
               for key in ("output_recall", "f_beta", "answer_found", "full_recall")}
        for kind in ("greedy", "sampled")
    }  # fmt: skip
    for arm, record in arms.items():
        alerts = seed_dir / arm / "alerts.jsonl"
        rows = [json.loads(line) for line in alerts.read_text().splitlines()] if alerts.exists() else []
        record["alerts"] = {m: sum(r["monitor"] == m for r in rows) for m in sorted({r["monitor"] for r in rows})}
    data = {k: v for k, v in args.data.items()
            if k in ("counts", "hops", "pairs", "overlaps", "chunk_tokens", "documents_in_corpus")}  # fmt: skip
    return {"design": args.design, "seed": args.seed, "sft_seed": args.sft_seed, "minutes": args.minutes,
            "command": command, "cpu": cpu_model(), "load_average_at_end": os.getloadavg(), "data": data,
            "start": start, "arms": arms, "grpo_minus_sft_only": deltas}  # fmt: skip


def line(name: str, steps: str, final: dict[str, Any]) -> str:
    g, s = final["greedy"], final.get("sampled")
    sampled = (f" | T=1 recall {fmt(s['output_recall']):18} F2 {fmt(s['f_beta'])} invalid/ep "
               f"{s['invalid_tool_calls']['value']:.2f}") if s else ""  # fmt: skip
    found, invalid = fmt(g["answer_found"]), g["invalid_tool_calls"]["value"]
    return (f"{name:9} {steps:>5}  recall {fmt(g['output_recall']):18} F2 {fmt(g['f_beta']):18} "
            f"found {found:18} invalid/ep {invalid:.2f}{sampled}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", choices=DESIGNS, default="onehop", help="task split (search_tasks.py)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arms (task order, sampling)")
    ap.add_argument("--sft-seed", type=int, default=0, help="seed of the warm start (shared by --seed runs)")
    ap.add_argument("--redo-sft", action="store_true", help="remake the warm start even if one exists")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--learner-precision", default="float32", help="float32, bfloat16 or auto (TrainConfig field)")
    ap.add_argument("--minutes", type=float, default=20.0, help="training wall-clock budget per arm")
    ap.add_argument("--resume", action="store_true", help="continue this seed's run directory")
    ap.add_argument("--pilot", action="store_true", help="only the data, the SFT warm start and its evaluation")
    ap.add_argument("--sft-steps", type=int, default=12, help="SFT steps of the common warm start")
    ap.add_argument("--sft-tasks", type=int, default=8, help="expert episodes per SFT step")
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate")
    ap.add_argument("--tasks", type=int, default=2, help="GRPO tasks per step")
    ap.add_argument("--group-size", type=int, default=4, help="GRPO samples per task")
    ap.add_argument("--entropy-coef", type=float, default=0.0)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--context", type=int, default=2048, help="context tokens per episode (= the env's budget T)")
    ap.add_argument("--per-call-budget", type=int, default=256, help="tokens one search result may hold")
    ap.add_argument("--eval-tasks", type=int, default=40, help="held-out tasks of the final greedy evaluation")
    ap.add_argument("--sampled-tasks", type=int, default=8, help="held-out tasks of the T=1 x 4 evaluation")
    ap.add_argument("--eval-concurrency", type=int, default=8, help="held-out episodes played at once (32: 8.8 GB)")
    ap.add_argument("--start-sampled", action="store_true", help="also evaluate the warm start at T=1")
    ap.add_argument("--curve-tasks", type=int, default=8, help="held-out tasks of each curve point (greedy)")
    ap.add_argument("--curve-points", type=int, default=1, help="curve evaluations during training")
    ap.add_argument("--max-steps", type=int, default=10_000, help="step cap (the budget normally ends a run)")
    ap.add_argument("--micro-batch-tokens", type=int, default=0,
                    help="forward/backward tokens per micro-batch, every stage (0: default; arms <= 2048)")  # fmt: skip
    ap.add_argument("--device", default="auto")
    ap.add_argument("--run-dir", default=None, help="default: runs/learning_search[_<design>]")
    ap.add_argument("--out", default=None, help="default: docs/learning_search[_<design>].png")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the JSON next to --out")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--sft-threads", type=int, default=0, help="torch threads of the warm start (0: --threads)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    counts = (args.sft_steps, args.eval_tasks, args.sampled_tasks, args.curve_tasks, args.eval_concurrency)
    if args.minutes <= 0 or min(counts) < 1 or args.group_size < 2:
        ap.error("--minutes must be > 0; --group-size >= 2; every other count >= 1")
    suffix = "" if args.design == "onehop" else f"_{args.design}"
    out = Path(args.out or ROOT / "docs" / f"learning_search{suffix}.png")
    data_path = out.with_suffix(".json")
    if args.plot_only:
        from experiments.search_plots import plot_search

        return plot_search(json.loads(data_path.read_text()), out)
    from experiments.search_tasks import prepare

    run_dir = Path(args.run_dir or f"runs/learning_search{suffix}")
    run_dir.mkdir(parents=True, exist_ok=True)
    args.data = prepare(run_dir / "data", args.design)  # built by the parent before any child starts; children reuse it
    seed_dir, sft_dir = run_dir / f"seed_{args.seed}", run_dir / f"sft_seed_{args.sft_seed}"
    if args.child == "sft":
        return run_sft(sft_dir, args, stage_config=stage_config,
                       start_evals=lambda trainer: final_evals(trainer, args, sampled=args.start_sampled))  # fmt: skip
    if args.child in ARMS:
        return run_arm(args.child, seed_dir, sft_dir / "start", args, stage_config=stage_config, held_out=held_out,
                       final_evals=final_evals, step_keys=STEP_KEYS)  # fmt: skip
    print(f"data: {args.data['counts']} tasks, overlaps {args.data['overlaps']}")
    fresh_dirs(seed_dir, sft_dir, args)
    command = " ".join(["python", "experiments/search.py", *sys.argv[1:]])
    (seed_dir / "commands.txt").open("a").write(command + "\n")
    began = time.monotonic()
    run_stages(__file__, ["sft"], sft_dir, threads=args.sft_threads or args.threads)
    start = json.loads((sft_dir / "start.json").read_text())
    print(f"SFT {start['sft_steps']} steps in {start['sft_s']:.0f}s, nll {start['sft_nll']}")
    print(line("start", "-", start))
    if args.pilot:
        return None
    run_stages(__file__, ARMS, seed_dir, threads=args.threads)
    result = seed_result(seed_dir, sft_dir, args, command)
    result["wall_s"] = time.monotonic() - began
    data = save_seed(data_path, args.seed, result)
    from experiments.search_plots import plot_search

    plot_search(data, out)
    print(line("start", "-", start))
    for arm, record in result["arms"].items():
        print(line(arm, str(len(record["steps"])), record["final"]))
    for kind, deltas in result["grpo_minus_sft_only"].items():
        print(f"grpo - sft_only {kind} (paired over tasks): " + ", ".join(f"{k} {fmt(v)}" for k, v in deltas.items()))
    print(f"plot: {out}; numbers: {data_path}")
    return None


if __name__ == "__main__":
    main()
