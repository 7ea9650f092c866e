"""Self-summarization vs harness compaction (issue 22 item 2): does RL on the agent's own summaries beat a
well-engineered harness summary, with fewer summary tokens?

Not run in CI. One seed's run, every stage a normal ``Trainer`` run in RUN_DIR/seed_N/, on ``prices`` listings of
5-6 items with one lookup per turn (``one_call_per_turn``), so the final answer needs prices observed many turns
before the context trigger:
1. ``sft``: LoRA behaviour cloning of the expert (one lookup per turn, then the listing) on 2-6 item training
   combinations; with ``--sft-summaries`` (default) the demonstrations compact at the low trigger and the expert
   answers the summary request with the prices it knows (without them SmolLM2 answers it with a tool call: an
   empty summary, reward 0 for every sample, nothing for GRPO to learn from). ``--sft-uncompacted-share``
   (default 0.5) of them play without compaction, so the warm start also sees long uncompacted views and the
   ceiling works (0 reproduces the first run, whose model only saw views of ~2 lookups and looped without
   compaction); these mixed demonstrations are played once into SFT_DIR/demonstrations.jsonl. The warm start is
   merged and saved as the common checkpoint of every arm. "self_untrained" is self-summary after SFT only.
2. Two child processes from that checkpoint, at once (one torch thread each): ``baselines`` evaluates it as
   (a) ``ceiling``: no compaction, room for everything; (b) ``prompted``: at the trigger the harness asks the same
   model, in a separate conversation, for a summary under an engineered prompt (``taskrl.context``);
   ``state_dump``: the harness lists every tool call and result so far (no model call); (c) ``self_untrained``:
   the agent writes its own summary. ``grpo`` trains (d) GRPO with self-summary on (summary tokens sampled in the
   episode and trained on its reward) at the low trigger for ``--minutes`` of training wall-clock, then evaluates
   ``self_trained`` at both triggers and its own ceiling.
3. Every evaluation: the same held-out tasks (test split: no item combination any training task uses), greedy,
   at both triggers. Per arm and trigger: success (bootstrap 95% CI over tasks), compaction error = success of
   (a) - success of the arm, paired per task with a CI, summary tokens per summary and per episode, turns,
   re-lookups (lookups of an item already looked up: what a forgotten price costs; ``max_turns`` bounds them) and
   invalid calls.

Writes docs/learning_summary.json (every seed run so far) and docs/learning_summary.png. ``--pilot`` runs every
stage at toy size; ``--resume`` continues an interrupted seed.

    python experiments/summary.py --seed 0 --minutes 12 [--resume] [--pilot]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # experiments.*, from any working directory
from experiments.common import fresh_dirs, run_arm, run_sft, run_stages, save_seed, summarise  # noqa: E402
from experiments.tool_use import cpu_model, fmt, paired_delta  # noqa: E402

BASELINES = ("prompted", "state_dump", "self_untrained")
"""The warm start's compaction arms (besides its ``ceiling``); ``grpo`` adds ``self_trained``."""
MODE = {"prompted": "prompted", "state_dump": "state_dump", "self_untrained": "self", "self_trained": "self"}
METRICS = ("success", "reward", "turns", "relookups", "invalid_calls", "tool_errors", "compactions",
           "summary_tokens", "summary_tokens_total")  # fmt: skip
STEP_KEYS = ("rewards/total", "rewards/std", "rewards/items_right", "tools/tool_calls", "tools/invalid_tool_calls",
             "losses/entropy", "losses/policy_loss", "charts/groups", "charts/dropped_groups",
             "charts/step_time_s")  # fmt: skip


def env_kwargs(args: argparse.Namespace, *, demos: bool = False) -> dict[str, Any]:
    """One lookup per turn; demonstrations list 2-6 items, GRPO and evaluation 5-6 (``--min-items``)."""
    low = args.sft_min_items if demos else args.min_items
    return {"min_items": low, "max_items": args.max_items, "one_call_per_turn": True}


def summary_config(args: argparse.Namespace, trigger: int | None, mode: str | None) -> dict[str, Any]:
    """The ``summary`` table of a config: {} (off) for the ceiling."""
    if trigger is None or mode is None:
        return {}
    return {"trigger_tokens": trigger, "mode": mode, "max_summary_tokens": args.max_summary_tokens}


def stage_config(stage: str, run_dir: Path, start: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig of ``sft`` (the warm start), ``grpo``, or an evaluation-only trainer of the warm start
    (``sft_only``: what ``common.run_sft`` evaluates the start with; ``baselines``)."""
    config = {"finetune": "lora", "lora.rank": 16, "lora.alpha": 32.0, "rollout.max_turns": args.max_turns,
              "rollout.max_new_tokens": args.max_new_tokens, "rollout.max_context_tokens": args.max_context_tokens,
              "rollout.temperature": 1.0, "device": args.device, "dtype": args.dtype, "seed": args.seed,
              "progress": False,
              "env": "prices", "split": "train", "run_dir": str(run_dir), "resume": True}  # fmt: skip
    if stage == "sft":  # with --sft-summaries the expert's episodes compact at the low trigger (self-summaries)
        summary = summary_config(args, args.triggers[0], "self") if args.sft_summaries else {}
        sft_data = "expert"
        if mixed_demonstrations(args):  # played beforehand: the file holds the compacted and the uncompacted ones
            sft_data, summary = str(demonstrations_path(run_dir.parent)), {}
        return {**config, "seed": args.sft_seed, "model": args.model, "algo.name": "sft", "steps": args.sft_steps,
                "sft_data": sft_data, "lr": args.sft_lr, "rollout.tasks_per_step": args.sft_tasks,
                "rollout.group_size": 1,
                "env_kwargs": env_kwargs(args,
                                         demos=True), "checkpoint_every": 0, "rollout.summary": summary}  # fmt: skip
    assert start is not None
    config.update({"model": str(start), "checkpoint_every": 1})
    if stage in ("sft_only", "baselines"):  # never trained: only its evaluations run
        return {**config, "algo.name": "sft", "sft_data": "expert", "steps": 1, "lr": args.sft_lr,
                "rollout.tasks_per_step": 1,
                "rollout.group_size": 1, "env_kwargs": env_kwargs(args, demos=True)}  # fmt: skip
    return {**config, "algo.name": "grpo", "steps": args.max_steps, "lr": args.lr, "env_kwargs": env_kwargs(args),
            "rollout.tasks_per_step": args.tasks, "rollout.group_size": args.group_size, "algo.normalize_std": True,
            "rollout.summary": summary_config(args, args.triggers[0], "self")}  # fmt: skip


def mixed_demonstrations(args: argparse.Namespace) -> bool:
    """Whether the warm start learns from compacted and uncompacted demonstrations alike."""
    return args.sft_summaries and args.sft_uncompacted_share > 0


def demonstrations_path(sft_dir: Path) -> Path:
    return sft_dir / "demonstrations.jsonl"


def demo_tokenizer(model: str) -> Any:
    """The tokenizer of the warm start's base model (the demonstrations' token ids are its)."""
    if model == "smollm2":
        from taskrl.policies.models import smollm2_tokenizer

        return smollm2_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, local_files_only=True)


def write_demonstrations(path: Path, args: argparse.Namespace) -> list[Any]:
    """The expert's ``--sft-steps`` x ``--sft-tasks`` demonstrations of the mixed warm start, written to ``path``:
    training tasks in a seeded order (cycling), each played without compaction with probability
    ``--sft-uncompacted-share`` and otherwise self-summarised at the low trigger. Token-exact (the expert's ids
    under the base model's chat format), so SFT reads them as it would the expert's live episodes."""
    from taskrl.chat import ChatFormat
    from taskrl.context import from_value
    from taskrl.envs.prices import PricesEnv
    from taskrl.policies.base import SamplingParams
    from taskrl.policies.scripted import ScriptedPolicy
    from taskrl.rollout import RolloutConfig, run_episodes
    from taskrl.types import write_jsonl

    factory = lambda: PricesEnv(**env_kwargs(args, demos=True))  # noqa: E731
    train = list(factory().tasks("train"))
    rng = random.Random(args.sft_seed)
    order = [train[i % len(train)] for i in range(args.sft_steps * args.sft_tasks)]
    rng.shuffle(order)
    uncompacted = [rng.random() < args.sft_uncompacted_share for _ in order]
    expert = ScriptedPolicy(factory().scripted_rule, name="expert", chat_format=ChatFormat(demo_tokenizer(args.model)))

    def rollout(summary: dict[str, Any]) -> RolloutConfig:
        return RolloutConfig(max_turns=args.max_turns, max_context_tokens=args.max_context_tokens,
                             sampling=SamplingParams(max_new_tokens=args.max_new_tokens), seed=args.sft_seed,
                             summary=from_value(summary, "summary"))  # fmt: skip

    plain = [t for t, u in zip(order, uncompacted, strict=True) if u]
    compacted = [t for t, u in zip(order, uncompacted, strict=True) if not u]
    demos = asyncio.run(run_episodes(factory, expert, plain, rollout({})))
    demos += asyncio.run(run_episodes(factory, expert, compacted, rollout(summary_config(args, args.triggers[0],
                                                                                          "self"))))  # fmt: skip
    failed = [t.task_id for t in demos if t.error is not None or not t.terminated]
    if failed:
        raise RuntimeError(f"the expert failed its demonstrations of {failed}: check --max-turns and the triggers")
    partial = path.with_suffix(".partial")
    write_jsonl(str(partial), demos, append=False)
    partial.replace(path)  # whole or absent: a killed run replays them
    return demos


def eval_tasks(n: int, args: argparse.Namespace) -> list[Any]:
    from taskrl.envs.prices import PricesEnv

    return list(PricesEnv(num_tasks=n, **env_kwargs(args)).tasks("test"))


def episode_row(traj: Any) -> dict[str, Any]:
    """One evaluation episode's numbers (after scoring)."""
    from taskrl.envs.prices import relookups

    m = traj.metrics
    return {"task_id": traj.task_id, "error": traj.error,
            "success": float(traj.error is None and traj.reward >= 1.0 - 1e-9), "reward": traj.reward,
            "turns": m.get("turns", 0.0), "relookups": float(relookups(traj.messages)),
            "invalid_calls": m.get("invalid_tool_calls", 0.0), "tool_errors": m.get("tool_errors", 0.0),
            "compactions": m.get("compactions", 0.0), "summary_tokens": m.get("summary_tokens", math.nan),
            "summary_tokens_total": m.get("summary_tokens_total", 0.0)}  # fmt: skip


def evaluate_arm(trainer: Any, name: str, args: argparse.Namespace, *, trigger: int | None, mode: str | None,
                 n: int) -> dict[str, Any]:  # fmt: skip
    """Greedy episodes of the trainer's weights on the held-out tasks, compacting at ``trigger`` by ``mode``."""
    from taskrl.envs.prices import PricesEnv
    from taskrl.eval import EvalConfig, evaluate

    tasks = eval_tasks(n, args)
    config = EvalConfig(samples_per_task=1, temperature=0.0, max_turns=args.max_turns,
                        max_new_tokens=args.max_new_tokens, max_context_tokens=args.max_context_tokens,
                        concurrency=32, seed=args.seed, summary=summary_config(args, trigger, mode))  # fmt: skip
    played: list[Any] = []
    factory = lambda: PricesEnv(num_tasks=n, **env_kwargs(args))  # noqa: E731
    began = time.monotonic()
    job = evaluate(factory, {"policy": trainer.learner_policy}, tasks, config, run_log=trainer.run, name=name,
                   on_trajectory=lambda _, traj: played.append(traj))  # fmt: skip
    trainer.rollouts.run(job)
    # a resumed evaluation replays finished episodes from the run log without calling on_trajectory: read them back
    from taskrl.eval import _safe
    from taskrl.runlog import read_trajectories

    fresh = {t.seed for t in played}
    saved = read_trajectories(trainer.run.dir, f"{_safe(name)}-policy").get(0, [])
    played += [t for t in saved if t.seed not in fresh and t.error is None]
    rows = [episode_row(t) for t in played]
    out = summarise(rows, [t.id for t in tasks], METRICS, args.seed)
    out.update({"trigger": trigger, "mode": mode, "wall_s": time.monotonic() - began,
                "example_summary": next((s["text"] for t in played for s in t.info.get("summaries", [])), None)})
    return out


def arm_evals(trainer: Any, args: argparse.Namespace, arms: tuple[str, ...], *, ceiling: bool) -> dict[str, Any]:
    """Each arm at each trigger, keyed ``ARM@TRIGGER``, and with ``ceiling`` the no-compaction evaluation."""
    out = {}
    if ceiling:
        out["ceiling"] = evaluate_arm(trainer, "ceiling", args, trigger=None, mode=None, n=args.eval_tasks)
    for trigger in args.triggers:
        for arm in arms:
            out[f"{arm}@{trigger}"] = evaluate_arm(trainer, f"{arm}_{trigger}", args, trigger=trigger,
                                                   mode=MODE[arm], n=args.eval_tasks)  # fmt: skip
    return out


def held_out(trainer: Any, name: str, args: argparse.Namespace, *, n: int, sampled: bool) -> dict[str, Any]:
    """A curve point of the GRPO arm: self-summary at the training trigger."""
    return evaluate_arm(trainer, name, args, trigger=args.triggers[0], mode="self", n=n)


def run_baselines(seed_dir: Path, start: Path, args: argparse.Namespace, triggers: list[int]) -> None:
    """Child: the warm start's harness and untrained self-summary arms at ``triggers`` (its ceiling is in
    start.json), one record per trigger (baselines_TRIGGER.json), so triggers can run in separate processes."""
    import torch

    torch.set_num_threads(args.threads)
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    for trigger in triggers:
        path = seed_dir / f"baselines_{trigger}.json"
        if path.exists():
            continue
        run_dir = seed_dir / ("baselines" if trigger == args.triggers[0] else f"baselines_{trigger}")
        trainer = Trainer(config_from_dict(stage_config("baselines", run_dir, start, args)))
        try:
            evals = {f"{arm}@{trigger}": evaluate_arm(trainer, f"{arm}_{trigger}", args, trigger=trigger,
                                                      mode=MODE[arm], n=args.eval_tasks) for arm in BASELINES}
            path.write_text(json.dumps({"evals": evals}, indent=1))
        finally:
            trainer.close()


def compaction_report(evals: dict[str, Any], ceiling: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Per ``ARM@TRIGGER``: success, compaction error (paired against ``ceiling``), summary tokens, turns,
    re-lookups and invalid calls; ``compaction_error_reward`` is the same on the per-item credit."""
    out = {}
    for key, result in evals.items():
        out[key] = {
            "success": result["success"],
            "compaction_error": paired_delta(result["per_task"]["success"], ceiling["per_task"]["success"], args.seed),
            # the same on the per-item credit (reward): it sees a price lost where success only sees a task lost
            "compaction_error_reward": paired_delta(result["per_task"]["reward"], ceiling["per_task"]["reward"],
                                                    args.seed),
            **{k: result[k] for k in METRICS if k != "success"},
        }  # fmt: skip
    return out


def first_tasks(result: dict[str, Any], n: int, seed: int) -> dict[str, Any]:
    """An evaluation cut to its first ``n`` tasks (a resumed run with fewer --eval-tasks: the task list of n tasks
    is the first n of a longer one), its means and CIs recomputed."""
    from taskrl.eval import bootstrap_ci

    if result["tasks"] <= n:
        return result
    out = {**result, "tasks": n, "per_task": {k: v[:n] for k, v in result["per_task"].items()}}
    for key, values in out["per_task"].items():
        ci = bootstrap_ci(values, seed=seed)
        out[key] = {"value": sum(values) / n, "low": ci[0] if ci else None, "high": ci[1] if ci else None}
    return out


def seed_result(seed_dir: Path, sft_dir: Path, args: argparse.Namespace, command: str) -> dict[str, Any]:
    start = json.loads((sft_dir / "start.json").read_text())
    baselines = {k: v for t in args.triggers for k, v in
                 json.loads((seed_dir / f"baselines_{t}.json").read_text())["evals"].items()}  # fmt: skip
    grpo = json.loads((seed_dir / "grpo.json").read_text())
    evals = {**baselines, **{k: v for k, v in grpo["final"].items() if k != "ceiling"}}
    ceiling = first_tasks(start["ceiling"], args.eval_tasks, args.seed)
    arms = compaction_report(evals, ceiling, args)
    bought = {}
    for trigger in args.triggers:  # what RL bought: self_trained - self_untrained, paired over tasks
        untrained, trained = evals[f"self_untrained@{trigger}"], evals[f"self_trained@{trigger}"]
        prompted = evals[f"prompted@{trigger}"]
        bought[str(trigger)] = {  # on success, and (``_reward``) on the per-item credit
            f"trained_minus_{name}{suffix}": paired_delta(other["per_task"][key], trained["per_task"][key], args.seed)
            for name, other in (("untrained", untrained), ("prompted", prompted))
            for key, suffix in (("success", ""), ("reward", "_reward"))
        }  # fmt: skip
    return {"seed": args.seed, "sft_seed": args.sft_seed, "minutes": args.minutes, "command": command,
            "sft_summaries": args.sft_summaries, "sft_uncompacted_share": args.sft_uncompacted_share,
            "triggers": args.triggers, "cpu": cpu_model(), "load_average_at_end": os.getloadavg(),
            "start": {k: start[k] for k in ("sft_steps", "sft_s", "sft_nll")}, "ceiling": ceiling,
            "ceiling_after_grpo": grpo["final"]["ceiling"], "arms": arms, "rl": bought,
            "grpo": {"steps": grpo["steps"], "train_s": grpo.get("train_s"), "curve": grpo["curve"]},
            "eval_wall_s": {k: v["wall_s"] for k, v in evals.items()}}  # fmt: skip


def print_table(result: dict[str, Any]) -> None:
    c = result["ceiling"]
    print(f"ceiling (no compaction): success {fmt(c['success'])}, turns {c['turns']['value']:.1f}")
    print(f"{'arm@trigger':22} {'success':18} {'compaction error':20} {'tok/summary':>11} {'tok/ep':>7} "
          f"{'turns':>5} {'relook':>6} {'invalid':>7}")  # fmt: skip
    for key, arm in result["arms"].items():
        print(f"{key:22} {fmt(arm['success']):18} {fmt(arm['compaction_error']):20} "
              f"{arm['summary_tokens']['value']:11.1f} {arm['summary_tokens_total']['value']:7.1f} "
              f"{arm['turns']['value']:5.1f} {arm['relookups']['value']:6.2f} {arm['invalid_calls']['value']:7.2f}")
    for trigger, rl in result["rl"].items():
        print(f"trigger {trigger}: trained - untrained {fmt(rl['trained_minus_untrained'])} (per-item credit "
              f"{fmt(rl['trained_minus_untrained_reward'])}), trained - prompted {fmt(rl['trained_minus_prompted'])} "
              f"(per-item credit {fmt(rl['trained_minus_prompted_reward'])})")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the arms (task order, sampling)")
    ap.add_argument("--sft-seed", type=int, default=0, help="seed of the warm start (shared by --seed runs)")
    ap.add_argument("--redo-sft", action="store_true", help="remake the warm start even if one exists")
    ap.add_argument("--model", default="smollm2", help="base model of the warm start (tests pass a tiny one)")
    ap.add_argument("--dtype", default="auto", help="weights dtype of every stage (LoRA adapters stay float32)")
    ap.add_argument("--minutes", type=float, default=12.0, help="GRPO training wall-clock budget")
    ap.add_argument("--resume", action="store_true", help="continue this seed's run directory")
    ap.add_argument("--pilot", action="store_true", help="every stage at toy size (sizes the real run)")
    ap.add_argument("--triggers", default="360,480", help="two trigger_tokens, low (trained) first: with the "
                    "SmolLM2 tokenizer the 254-token opening reaches 371 after 2 lookups and 489 after 4")
    ap.add_argument("--min-items", type=int, default=5, help="fewest items of a GRPO / evaluation listing")
    ap.add_argument("--max-items", type=int, default=6)
    ap.add_argument("--sft-min-items", type=int, default=2, help="fewest items of a demonstration")
    ap.add_argument("--sft-steps", type=int, default=20, help="SFT steps of the common warm start")
    ap.add_argument("--sft-summaries", action=argparse.BooleanOptionalAction, default=True,
                    help="demonstrations compact at the low trigger with the expert's self-summary (without them "
                    "SmolLM2 answers a summary request with a tool call: an empty summary, reward 0, no GRPO signal)")
    ap.add_argument("--sft-uncompacted-share", type=float, default=0.5,
                    help="share of the demonstrations played without compaction, so the warm start also sees long "
                    "uncompacted views (its ceiling works); 0: all compact, the first run's warm start")
    ap.add_argument("--sft-tasks", type=int, default=8, help="expert episodes per SFT step")
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate")
    ap.add_argument("--tasks", type=int, default=2, help="GRPO tasks per step")
    ap.add_argument("--group-size", type=int, default=4, help="GRPO samples per task")
    ap.add_argument("--max-turns", type=int, default=8, help="6 lookups + the answer, 1 spare (bounds re-lookups)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-summary-tokens", type=int, default=96, help="cap of a self or prompted summary")
    ap.add_argument("--max-context-tokens", type=int, default=1024, help="room for everything (the ceiling)")
    ap.add_argument("--eval-tasks", type=int, default=24, help="held-out tasks of every evaluation")
    ap.add_argument("--curve-tasks", type=int, default=6, help="held-out tasks of each GRPO curve point")
    ap.add_argument("--curve-points", type=int, default=0, help="GRPO curve evaluations during training")
    ap.add_argument("--max-steps", type=int, default=10_000, help="step cap (the budget normally ends a run)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--run-dir", default="runs/learning_summary")
    ap.add_argument("--out", default=str(ROOT / "docs" / "learning_summary.png"))
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.triggers = [int(t) for t in str(args.triggers).split(",")]
    if args.pilot:
        args.sft_steps, args.sft_tasks, args.eval_tasks, args.tasks, args.group_size = 1, 2, 3, 1, 2
        args.minutes, args.curve_points, args.curve_tasks = min(args.minutes, 0.5), 1, 2
    if len(args.triggers) != 2 or not 0 < args.triggers[0] < args.triggers[1] < args.max_context_tokens:
        ap.error("--triggers must be two increasing token counts below --max-context-tokens, e.g. 360,480")
    if not 0 <= args.sft_uncompacted_share <= 1:
        ap.error("--sft-uncompacted-share must be a share between 0 and 1")
    if args.minutes <= 0 or min(args.sft_steps, args.eval_tasks, args.curve_tasks) < 1 or args.group_size < 2:
        ap.error("--minutes must be > 0; --sft-steps, --eval-tasks, --curve-tasks >= 1; --group-size >= 2")
    return args


def main() -> None:
    args = parse_args()
    seed_dir = Path(args.run_dir) / f"seed_{args.seed}"
    sft_dir = Path(args.run_dir) / f"sft_seed_{args.sft_seed}"
    start = sft_dir / "start"
    if args.child == "sft":  # the start record: its ceiling (the baselines child evaluates the rest)
        if mixed_demonstrations(args) and not demonstrations_path(sft_dir).exists():
            write_demonstrations(demonstrations_path(sft_dir), args)
        return run_sft(sft_dir, args, stage_config=stage_config, start_evals=lambda trainer: {
            "ceiling": evaluate_arm(trainer, "start_ceiling", args, trigger=None, mode=None, n=args.eval_tasks)})
    if args.child == "baselines":
        return run_baselines(seed_dir, start, args, args.triggers)
    if args.child and args.child.startswith("baselines_"):  # one trigger alone: baselines_480
        return run_baselines(seed_dir, start, args, [int(args.child.removeprefix("baselines_"))])
    if args.child == "grpo":
        return run_arm("grpo", seed_dir, start, args, stage_config=stage_config, held_out=held_out,
                       final_evals=lambda trainer, a: arm_evals(trainer, a, ("self_trained",), ceiling=True),
                       step_keys=STEP_KEYS)  # fmt: skip
    out = Path(args.out)
    fresh_dirs(seed_dir, sft_dir, args)
    command = " ".join(["python", "experiments/summary.py", *sys.argv[1:]])
    (seed_dir / "commands.txt").open("a").write(command + "\n")
    began = time.monotonic()
    run_stages(__file__, ["sft"], sft_dir, threads=args.threads)
    record = json.loads((sft_dir / "start.json").read_text())
    ceiling = record["ceiling"]
    print(f"start (SFT, {record['sft_steps']} steps, {record['sft_s']:.0f}s): ceiling {fmt(ceiling['success'])}, "
          f"{ceiling['wall_s']:.0f}s for {args.eval_tasks} episodes", flush=True)  # fmt: skip
    run_stages(__file__, ("baselines", "grpo"), seed_dir, threads=args.threads)
    result = seed_result(seed_dir, sft_dir, args, command)
    result["wall_s"], result["pilot"] = time.monotonic() - began, args.pilot
    data = save_seed(out.with_suffix(".json"), args.seed, result) if not args.pilot else {"seeds": {"0": result}}
    from experiments.summary_plots import plot_summary

    plot_summary(data, out if not args.pilot else seed_dir / "pilot.png")
    (seed_dir / "result.json").write_text(json.dumps(result, indent=1))
    print_table(result)
    print(f"wall {result['wall_s']:.0f}s; numbers: {seed_dir / 'result.json'}")
    return None


if __name__ == "__main__":
    main()
