"""Tool-use learning recipe (issue 14): does GRPO teach SmolLM2-135M a skill its SFT warm start never showed?

Not run in CI. One seed's run, every stage a normal ``Trainer`` run in RUN_DIR/seed_N/:
1. ``sft``: LoRA behaviour cloning on the ``shop`` expert's **single-item** orders (lookup_price -> calculator ->
   answer); merged into the base and saved as the common starting checkpoint of both arms, which is
   evaluated here ("start").
2. Two arms from that checkpoint, run at once as child processes with one torch thread each (so they face the
   same machine load), each for ``--minutes`` of training wall-clock (evaluations excluded):
   ``sft_only`` keeps cloning the single-item demonstrations; ``grpo`` runs GRPO on **multi-item** orders
   (two items: two lookups and a sum, a skill no demonstration shows).
3. Held-out evaluation of each arm on multi-item orders from the held-out (item, quantity) pairs (no pair is
   shared with any training task): greedy success and sampled success (T=1, pass@1 over 4 samples) with
   percentile-bootstrap CIs over tasks, plus curve points (greedy, a task subset) during training.

Issue 40's control ladder: ``--arms sft_only sft3 rft grpo`` adds ``sft3`` (SFT on expert demonstrations of the
RL arm's task shape: the upper bound of imitation) and ``rft`` (SFT on the policy's own verified samples, with
GRPO's prompts and sample budget), each from the same warm start and for the same ``--minutes``. ``--generalise``
adds greedy evaluations on four-item listings and on listings of items no training task asks for.

Writes docs/learning_tool_use.json (every seed run so far) and docs/learning_tool_use.png. ``--resume``
continues an interrupted seed from its checkpoints and records; without it the seed's run directory starts over.

    python experiments/tool_use.py --seed 0 --minutes 12 [--resume] [--pilot]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # experiments.plots, from any working directory
from experiments.common import fresh_dirs, run_arm, run_sft, run_stages, save_seed  # noqa: E402
from taskrl.eval import paired_delta  # noqa: E402  (re-exported: the other recipes import it from here)

ARMS = ("sft_only", "grpo")
LADDER = ("sft_only", "sft3", "rft", "grpo")
"""Issue 40's control ladder (``--arms``): ``sft3`` clones the expert on the RL arm's task shape (3-item listings
in prices3: the upper bound of imitation), ``rft`` fine-tunes on the policy's own successes with GRPO's prompts
and sample budget (``experiments.arms.rft_config``)."""
DESIGNS: dict[str, dict[str, Any]] = {
    # The default (issue 14, second design): copy-only listing of looked-up prices, per-item credit (dense).
    "prices": {"env": "prices", "sft": {"min_items": 1, "max_items": 1}, "eval": {"min_items": 2, "max_items": 3},
               "rl": {"min_items": 2, "max_items": 3}},
    # Length generalisation: demonstrations list one or two items, RL and evaluation three.
    "prices3": {"env": "prices", "sft": {"min_items": 1, "max_items": 2}, "eval": {"min_items": 3, "max_items": 3},
                "rl": {"min_items": 3, "max_items": 3}},
    # prices3's training and ladder with the generalisation sets pre-registered (always evaluated): a study of its
    # own, because prices3's test seeds were used before its generalisation sets existed.
    "prices3g": {"env": "prices", "sft": {"min_items": 1, "max_items": 2}, "eval": {"min_items": 3, "max_items": 3},
                 "rl": {"min_items": 3, "max_items": 3}, "generalise": True},
    # prices3g with DAPO's overlong filter on both RL arms (GRPO and its matched RFT): prices3g's RL arms learned
    # to leave their lookup turn to the 96-token cap (experiments/turn_caps.py); here a capped episode is neither
    # trained on by GRPO nor cloned by RFT. The one change from prices3g.
    "prices3f": {"env": "prices", "sft": {"min_items": 1, "max_items": 2}, "eval": {"min_items": 3, "max_items": 3},
                 "rl": {"min_items": 3, "max_items": 3}, "generalise": True, "rl_options": {"overlong_filter": True}},
    # prices3g with room in the RL arms' per-turn cap (160 new tokens in training, GRPO and its matched RFT): a turn
    # that runs on past its third call is no longer ended by the cap right after it, so running on can cost the episode.
    # Evaluation unchanged (96 on three items, 160 on the generalisation sets). The one change from prices3g.
    "prices3c": {"env": "prices", "sft": {"min_items": 1, "max_items": 2}, "eval": {"min_items": 3, "max_items": 3},
                 "rl": {"min_items": 3, "max_items": 3}, "generalise": True,
                 "rl_options": {"rollout.max_new_tokens": 160}},
    # The first design: order totals (lookups and a sum), sparse reward plus lookup credit; kept for comparison.
    "shop": {"env": "shop", "sft": {"min_items": 1, "max_items": 1}, "eval": {"min_items": 2, "max_items": 2},
             "rl": {"min_items": 2, "max_items": 2}},
}  # fmt: skip
"""Per design: the env, the demonstrations' tasks (single items: the format without the multi-item skill), the
GRPO arm's training tasks and the held-out evaluation tasks (test split: no combination shared with training);
optionally ``generalise`` (always evaluate ``GENERALISATION``) and ``rl_options`` (TrainConfig fields of the RL
arms, which the RFT arm matches where ``experiments.arms.MATCHED_FIELDS`` names them)."""


def rl_env(args: argparse.Namespace) -> dict[str, Any]:
    """The GRPO arm's training tasks: multi-item tasks (``shop`` adds the optional lookup partial credit)."""
    extra = {"lookup_credit": args.lookup_credit} if args.design == "shop" else {}
    return {**DESIGNS[args.design]["rl"], **extra}


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    """Fields every stage shares: the model format, episode limits and the seed."""
    return {
        "finetune": "lora",
        "lora.rank": 16,
        "lora.alpha": 32.0,
        "rollout.max_turns": args.max_turns,
        "rollout.max_new_tokens": args.max_new_tokens,
        "rollout.temperature": 1.0,
        "device": args.device,
        "dtype": args.dtype,
        "seed": args.seed,
        "progress": False,
        "env": DESIGNS[args.design]["env"],
        "split": "train",
    }


def stage_config(stage: str, run_dir: Path, start: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig of ``sft`` (the warm start), ``sft_only`` or ``grpo``; arms start from ``start``."""
    config = {**base_config(args), "run_dir": str(run_dir), "resume": True}
    if stage == "sft":
        config["seed"] = args.sft_seed
        # algo=sft trains at ``lr`` (``sft_lr`` is the warm-up's rate of an RL run)
        return {**config, "model": "smollm2", "algo.name": "sft", "steps": args.sft_steps, "sft_data": "expert",
                "lr": args.sft_lr, "rollout.tasks_per_step": args.sft_tasks, "rollout.group_size": 1,
                "env_kwargs": DESIGNS[args.design]["sft"], "checkpoint_every": 0}  # fmt: skip
    assert start is not None
    config.update({"model": str(start), "steps": args.max_steps, "checkpoint_every": 1})
    if stage == "sft_only":
        return {**config, "algo.name": "sft", "sft_data": "expert", "lr": args.sft_lr,
                "env_kwargs": DESIGNS[args.design]["sft"],
                "rollout.tasks_per_step": args.sft_tasks, "rollout.group_size": 1}  # fmt: skip
    if stage == "sft3":  # the expert handles any length: imitation on the held-out task shape
        return {**config, "algo.name": "sft", "sft_data": "expert", "lr": args.sft_lr, "env_kwargs": rl_env(args),
                "rollout.tasks_per_step": args.sft_tasks, "rollout.group_size": 1}  # fmt: skip
    grpo = {**config, "algo.name": "grpo", "lr": args.lr, "env_kwargs": rl_env(args),
            "rollout.tasks_per_step": args.tasks,
            "rollout.group_size": args.group_size, "entropy_coef": args.entropy_coef,
            # std-normalised advantages: partial-credit rewards differ by ~0.1, and ~10 updates must count
            "algo.normalize_std": True, **DESIGNS[args.design].get("rl_options", {})}  # fmt: skip
    if stage == "rft":
        from experiments.arms import rft_config

        return rft_config(grpo, min_reward=getattr(args, "rft_min_reward", 1.0), lr=args.sft_lr)
    return grpo


GENERALISATION: dict[str, dict[str, Any]] = {
    "gen4": {"min_items": 4, "max_items": 4},
    "novel": {"min_items": 3, "max_items": 3, "novel": True},
}
"""``--generalise`` (prices designs): greedy success on held-out sets beyond the design's own shape: four-item
listings (``gen4``), and three-item listings of items no training task asks for (``novel``: ``NOVEL_PRICES``)."""
GENERALISATION_NEW_TOKENS = 160
"""Tokens per turn in the generalisation evaluations (at least ``--max-new-tokens``). The expert's turn of four
lookups is 123-128 SmolLM2 tokens (over 512 draws of val and test; three lookups: 92-96), so the training cap of 96
would cut every four-item listing short of its fourth call: a cap, not a failure to generalise."""


def eval_tasks(n: int, args: argparse.Namespace, shape: dict[str, Any] | None = None) -> list[Any]:
    """``n`` held-out tasks of the design's evaluation shape (or ``shape``) from ``args.split`` (test when unset),
    with distinct prompts: the env draws with replacement, so duplicates are skipped (issue 40: 24 draws held 22
    prompts)."""
    from taskrl.env import make

    design = DESIGNS[args.design]
    drawn = make(design["env"], num_tasks=8 * n, **(shape or design["eval"])).tasks(getattr(args, "split", "test"))
    seen: set[str] = set()
    distinct = [t for t in drawn if not (t.prompt in seen or seen.add(t.prompt))]
    return distinct[:n]


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers a report needs from one ``taskrl.eval`` result."""
    stats = result["policies"]["policy"]

    def est(key: str) -> dict[str, float | None]:
        return {k: stats[key][k] for k in ("value", "low", "high")}

    return {"success": est("success_rate"), "pass@1": est("pass@1") if "pass@1" in stats else None,
            "tool_calls": stats["tool_calls"], "invalid_tool_calls": stats["invalid_tool_calls"],
            "tasks": result["tasks"], "samples_per_task": result["samples_per_task"],
            "wall_time_s": result["wall_time_s"],
            "per_task": [row["policies"]["policy"]["successes"] / max(row["policies"]["policy"]["n"], 1)
                         for row in result["per_task"]]}  # fmt: skip


def held_out(trainer: Any, name: str, args: argparse.Namespace, *, n: int, sampled: bool,
             shape: dict[str, Any] | None = None, max_new_tokens: int = 0) -> dict[str, Any]:  # fmt: skip
    """Greedy (or T=1, 4 samples) episodes of the trainer's current weights on held-out multi-item orders of the
    design's evaluation shape, or ``shape`` (env settings, e.g. a ``GENERALISATION`` set), with
    ``max_new_tokens`` per turn (0: ``--max-new-tokens``)."""
    from taskrl.env import make
    from taskrl.eval import EvalConfig, evaluate

    config = EvalConfig(
        samples_per_task=args.sampled_samples if sampled else 1, temperature=1.0 if sampled else 0.0,
        max_turns=args.max_turns,
        max_new_tokens=max_new_tokens or args.max_new_tokens, concurrency=32, seed=args.seed,
    )  # fmt: skip
    design = DESIGNS[args.design]
    factory = lambda: make(design["env"], num_tasks=args.eval_tasks, **(shape or design["eval"]))  # noqa: E731
    policies = {"policy": trainer.learner_policy}
    job = evaluate(factory, policies, eval_tasks(n, args, shape), config, run_log=trainer.run, name=name, step=0)
    return summary(trainer.rollouts.run(job))


def final_evals(trainer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy success on ``--eval-tasks`` held-out tasks, and sampled pass@1 unless ``--sampled-samples 0``."""
    finals = {"greedy": held_out(trainer, "heldout_greedy", args, n=args.eval_tasks, sampled=False)}
    if args.sampled_samples:
        finals["sampled"] = held_out(trainer, "heldout_sampled", args, n=args.eval_tasks, sampled=True)
    for key, shape in GENERALISATION.items() if getattr(args, "generalise", False) else ():
        finals[key] = held_out(trainer, f"heldout_{key}", args, n=args.eval_tasks, sampled=False, shape=shape,
                               max_new_tokens=max(args.max_new_tokens, GENERALISATION_NEW_TOKENS))
    return finals


STEP_KEYS = ("rewards/total", "rewards/std", "rewards/correct", "rewards/lookup_credit", "rewards/items_right",
            "tools/tool_calls",
            "tools/invalid_tool_calls", "losses/entropy", "losses/sft_nll", "losses/policy_loss", "charts/groups",
            "charts/dropped_groups", "charts/step_time_s", "charts/episodes", "charts/sampled_tokens",
            "charts/trained_trajectories")  # fmt: skip


def seed_result(seed_dir: Path, sft_dir: Path, args: argparse.Namespace, command: str) -> dict[str, Any]:
    """One seed's results from its records: start, both arms, and grpo - sft_only paired over tasks."""
    start = json.loads((sft_dir / "start.json").read_text())
    arms = {arm: json.loads((seed_dir / f"{arm}.json").read_text()) for arm in getattr(args, "arms", ARMS)}
    deltas = {
        kind: paired_delta(arms["sft_only"]["final"][kind]["per_task"], arms["grpo"]["final"][kind]["per_task"],
                           args.seed)
        for kind in arms["grpo"]["final"]
    } if {"sft_only", "grpo"} <= set(arms) else {}  # fmt: skip
    ladder = {f"grpo_minus_{arm}": {kind: paired_delta(arms[arm]["final"][kind]["per_task"],
                                                       arms["grpo"]["final"][kind]["per_task"], args.seed)
                                    for kind in arms["grpo"]["final"]}
              for arm in ("sft3", "rft") if arm in arms and "grpo" in arms}  # fmt: skip
    for arm, record in arms.items():  # the monitors' alerts during training, counted per monitor
        alerts = seed_dir / arm / "alerts.jsonl"
        rows = [json.loads(line) for line in alerts.read_text().splitlines()] if alerts.exists() else []
        record["alerts"] = {m: sum(r["monitor"] == m for r in rows) for m in sorted({r["monitor"] for r in rows})}
    return {"design": args.design, "seed": args.seed, "sft_seed": args.sft_seed, "minutes": args.minutes,
            "command": command,
            "cpu": cpu_model(), "load_average_at_end": os.getloadavg(), "start": start, "arms": arms,
            "grpo_minus_sft_only": deltas, **ladder}  # fmt: skip


def _study(args: argparse.Namespace) -> Any:
    """The recipe's ``Study`` (run records); with ``--split test`` every arm's test evaluation is claimed first
    (a ``--resume`` of a claimed seed goes on), and fewer than 64 distinct held-out tasks are refused."""
    from experiments.study import RUNS_DIR, Study

    study = Study("prices", args.runs_dir or RUNS_DIR)
    Study.check_held_out(eval_tasks(args.eval_tasks, args))
    if args.split == "test":
        for arm in ("start", *args.arms):
            if not (args.resume and study._claimed(args.design, arm, args.seed)):
                study.claim_test(args.design, arm, args.seed)
    return study


def record_runs(study: Any, result: dict[str, Any], args: argparse.Namespace) -> list[Path]:
    """One new run record per arm (and the start): greedy held-out success over tasks, with its budget."""
    def outcome(final: dict[str, Any]) -> dict[str, Any]:
        estimate = lambda e: {"value": e["value"], "ci": [e["low"], e["high"]] if e.get("low") is not None  # noqa: E731
                              else None} if e else None  # fmt: skip
        return {"greedy_success": estimate(final["greedy"]["success"]),
                "sampled_pass@1": estimate(final["sampled"]["pass@1"]) if "sampled" in final else None,
                "tasks": final["greedy"]["tasks"], "per_task": final["greedy"]["per_task"],
                **{f"{key}_greedy_success": estimate(final[key]["success"]) for key in GENERALISATION
                   if key in final}}  # fmt: skip

    baseline = "rft" if "rft" in result["arms"] else "sft_only"
    start = result["start"]
    secondary = [f"{key}_greedy_success" for key in GENERALISATION if key in start]
    extra = {"baseline_arm": baseline, "cpu_model": result["cpu"], "command": result["command"],
             **({"secondary": secondary} if secondary else {})}
    paths = [study.record(design=args.design, arm="start", seed=args.seed, split=args.split,
                          outcome=outcome(start), primary="greedy_success", config=start["config"],
                          budget={"train_s": start["sft_s"], "steps": start["sft_steps"]}, engine="hf-inprocess",
                          extra=extra)]  # fmt: skip
    for arm, record in result["arms"].items():
        steps = record["steps"]
        budget = {"steps": len(steps), "train_s": record.get("train_s"),
                  **{key: sum(s.get(f"charts/{key}") or 0.0 for s in steps)
                     for key in ("episodes", "sampled_tokens", "trained_trajectories")}}  # fmt: skip
        paths.append(study.record(design=args.design, arm=arm, seed=args.seed, split=args.split,
                                  outcome=outcome(record["final"]), primary="greedy_success",
                                  config=record["config"], budget=budget, engine="hf-inprocess", extra=extra))
    return paths


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    return f"{name}; amx_bf16 {'present' if 'amx_bf16' in out else 'absent'}"


def fmt(estimate: dict[str, Any] | None) -> str:
    if not estimate:
        return "-"
    ci = f" [{estimate['low']:.2f}, {estimate['high']:.2f}]" if estimate.get("low") is not None else ""
    return f"{estimate['value']:.2f}{ci}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", choices=sorted(DESIGNS), default="prices3", help="env design (see DESIGNS)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arms (task order, sampling)")
    ap.add_argument("--sft-seed", type=int, default=0, help="seed of the warm start (shared by --seed runs)")
    ap.add_argument("--redo-sft", action="store_true", help="remake the warm start even if one exists")
    ap.add_argument("--dtype", default="auto", help="weights dtype of every stage (LoRA adapters stay float32)")
    ap.add_argument("--minutes", type=float, default=15.0, help="training wall-clock budget per arm")
    ap.add_argument("--resume", action="store_true", help="continue this seed's run directory")
    ap.add_argument("--pilot", action="store_true", help="only the SFT warm start and its held-out evaluation")
    ap.add_argument("--sft-steps", type=int, default=4, help="SFT steps of the common warm start")
    ap.add_argument("--sft-tasks", type=int, default=8, help="expert episodes per SFT step")
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate")
    ap.add_argument("--tasks", type=int, default=3, help="GRPO tasks per step")
    ap.add_argument("--group-size", type=int, default=4, help="GRPO samples per task")
    ap.add_argument("--entropy-coef", type=float, default=0.0)
    ap.add_argument("--lookup-credit", type=float, default=0.3, help="partial credit weight of a wrong answer")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--eval-tasks", type=int, default=64, help="distinct held-out tasks of the final evals (>= 64)")
    ap.add_argument("--sampled-samples", type=int, default=4,
                    help="T=1 samples per held-out task for sampled pass@1 (0: greedy only, 1 episode per task)")
    ap.add_argument("--curve-tasks", type=int, default=8, help="held-out tasks of each curve point (greedy)")
    ap.add_argument("--curve-points", type=int, default=2, help="curve evaluations during training")
    ap.add_argument("--max-steps", type=int, default=10_000, help="step cap (the budget normally ends a run)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--run-dir", default=None, help="default: runs/learning_tool_use/DESIGN")
    ap.add_argument("--out", default=str(ROOT / "docs" / "learning_tool_use.png"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the JSON next to --out")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads per process (1: no OpenMP stalls on a shared machine)"
    )
    ap.add_argument("--sft-threads", type=int, default=0,
                    help="torch threads of the warm start and its evaluation, which run alone (0: every core)")
    ap.add_argument("--generalise", action="store_true",
                    help="also evaluate every arm greedily on 4-item listings and on 3-item listings of items no "
                         "training task asks for (prices designs; recorded as gen4_/novel_greedy_success)")
    ap.add_argument("--parallel-arms", type=int, default=0,
                    help="arms training at once (0: all; each tool-use arm peaked near 7 GB)")
    ap.add_argument("--arms", nargs="+", choices=LADDER, default=list(ARMS),
                    help="arms from the warm start (issue 40's ladder: sft_only sft3 rft grpo)")
    ap.add_argument("--split", choices=("val", "test"), default="val",
                    help="held-out split: designs are chosen on val; test needs the design frozen (study.py freeze)")
    ap.add_argument("--runs-dir", default=None, help="run records (default experiments/runs)")
    ap.add_argument("--rft-min-reward", type=float, default=1.0, help="rft keeps its samples with reward >= this")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.minutes <= 0 or min(args.sft_steps, args.eval_tasks, args.curve_tasks, args.group_size) < 1:
        ap.error("--minutes must be > 0; --sft-steps, --eval-tasks, --curve-tasks, --group-size >= 1")
    if args.sampled_samples < 0:
        ap.error("--sampled-samples must be >= 0 (0: no sampled evaluation)")
    args.generalise = args.generalise or DESIGNS[args.design].get("generalise", False)
    if args.generalise and DESIGNS[args.design]["env"] != "prices":
        ap.error(f"--generalise needs a prices design (its sets are prices listings), got {args.design!r}")
    if args.parallel_arms < 0:
        ap.error("--parallel-arms must be >= 0 (0: every arm at once)")
    if args.group_size < 2:
        ap.error("--group-size must be >= 2 (GRPO compares samples of one task)")
    args.run_dir = args.run_dir or f"runs/learning_tool_use/{args.design}"
    seed_dir = Path(args.run_dir) / f"seed_{args.seed}"
    sft_dir = Path(args.run_dir) / f"sft_seed_{args.sft_seed}"
    if args.child == "sft":
        return run_sft(sft_dir, args, stage_config=stage_config,
                       start_evals=lambda trainer: final_evals(trainer, args))  # fmt: skip
    if args.child in LADDER:
        return run_arm(args.child, seed_dir, sft_dir / "start", args, stage_config=stage_config, held_out=held_out,
                       final_evals=final_evals, step_keys=STEP_KEYS)  # fmt: skip
    out = Path(args.out)
    data_path = out.with_suffix(".json")
    if args.plot_only:
        from experiments.plots import plot_tool_use

        return plot_tool_use(json.loads(data_path.read_text()), out)
    study = _study(args)
    fresh_dirs(seed_dir, sft_dir, args)
    command = " ".join(["python", "experiments/tool_use.py", *sys.argv[1:]])
    (seed_dir / "commands.txt").open("a").write(command + "\n")
    began = time.monotonic()
    # the warm start runs alone: every core (the arms then share them, --threads each)
    run_stages(__file__, ["sft"], sft_dir, threads=args.sft_threads or os.cpu_count() or 1)
    start = json.loads((sft_dir / "start.json").read_text())
    print(f"start (SFT, {start['sft_steps']} steps, {start['sft_s']:.0f}s): held-out greedy "
          f"{fmt(start['greedy']['success'])}, sampled pass@1 {fmt(start.get('sampled', {}).get('pass@1'))}, "
          f"invalid calls {start['greedy']['invalid_tool_calls']:.2f}/episode (greedy)")  # fmt: skip
    if args.pilot:
        return None
    run_stages(__file__, list(args.arms), seed_dir, limit=args.parallel_arms, threads=args.threads)
    result = seed_result(seed_dir, sft_dir, args, command)
    result["wall_s"] = time.monotonic() - began
    data = save_seed(data_path, args.seed, result)
    for path in record_runs(study, result, args):
        print(f"record: {path}")
    from experiments.plots import plot_tool_use

    plot_tool_use(data, out)
    print(f"{'arm':9} {'steps':>5}  held-out greedy        sampled pass@1 (T=1, {args.sampled_samples} samples)")
    print(f"{'start':9} {'-':>5}  {fmt(start['greedy']['success']):22} {fmt(start.get('sampled', {}).get('pass@1'))}")
    for arm, record in result["arms"].items():
        final = record["final"]
        print(f"{arm:9} {len(record['steps']):5d}  {fmt(final['greedy']['success']):22} "
              f"{fmt(final.get('sampled', {}).get('pass@1'))}")  # fmt: skip
    for key in ("grpo_minus_sft_only", "grpo_minus_sft3", "grpo_minus_rft"):
        if result.get(key):
            deltas = result[key]
            print(f"{key} (paired over tasks): greedy {fmt(deltas['greedy'])}, sampled {fmt(deltas.get('sampled'))}")
    print(f"plot: {out}; numbers: {data_path}")
    return None


if __name__ == "__main__":
    main()
