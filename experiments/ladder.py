"""One study of the control ladder (issue 40), shared by ``reverse_text.py`` and ``countdown.py``: per seed, a
start (an SFT warm start on a few expert demonstrations, or the base model), then every arm from that same start
for its own time limit, each evaluated on held-out tasks of ``--split`` and written by ``Study.record``.

Arms: ``start`` (the start itself, no training), ``sft_more`` (SFT on expert demonstrations, as many per step as
the RL arm samples), ``rft`` (``arms.rft_config``: the GRPO arm's prompts and samples, SFT on its successes) and
``grpo``. Designs are compared on ``val``; ``--split test`` needs the design frozen (``study.py freeze``) and
claims each (design, arm, seed) once. Every record carries the config, the budget (steps, episodes, tokens,
seconds), the rollout engine, CPU model and load.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.arms import grpo_config, held_out, model_dir, rft_config, sft_config, train_arm
from experiments.study import RUNS_DIR, Study
from taskrl.policies.memory import release_freed

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "hf-inprocess"
"""The rollout engine of these studies (``rollout_policy=inprocess``); recorded with every run."""


@dataclass(frozen=True)
class LadderSpec:
    """What differs between ladder studies."""

    study: str
    env: str
    arms: tuple[str, ...]
    """Trained arms (``sft_more`` needs an env expert)."""
    warm_start: bool
    """SFT on expert demonstrations first (``start`` = the warm start), else ``start`` = the base model."""
    primary: str
    """The outcome the index reports: ``reward`` (mean held-out reward) or ``pass@1``."""
    eval_samples: int
    eval_temperature: float
    pass_ks: tuple[int, ...] = (1,)
    success_threshold: float = 1.0
    rft_min_reward: float = 1.0
    rft_keep: str = "all"
    """RFT's selection (``algos.sft.select``): every sample >= the threshold, or each prompt's best above its mean."""
    max_new_tokens: int = 48
    env_kwargs: tuple[tuple[str, Any], ...] = ()


def add_arguments(parser: argparse.ArgumentParser, spec: LadderSpec) -> None:
    add = parser.add_argument
    add("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds, the unit of every claim (>= 5)")
    add("--split", choices=("val", "test"), default="val", help="held-out split (test: design frozen, used once)")
    add("--design", default="d1", help="name of this set of settings (compare designs on val)")
    add("--arms", nargs="+", default=list(spec.arms), choices=["start", *spec.arms],
        help="arms to run (the start is evaluated per --start-seeds; `--arms start` evaluates only it)")  # fmt: skip
    add("--minutes", type=float, default=30.0, help="training wall-clock limit per arm")
    add("--max-steps", type=int, default=1000, help="step cap of each arm (the time limit normally ends it)")
    add("--model-path", default="smollm2", help="'smollm2', a save_pretrained directory or a .gguf file")
    add("--runs-dir", default=str(RUNS_DIR), help="where run records go (one new JSON per evaluated arm)")
    add("--work-dir", default=str(ROOT / "runs" / spec.study), help="trainer run directories")
    add("--tasks-per-step", type=int, default=8)
    add("--group-size", type=int, default=8, help="samples per prompt of GRPO and RFT")
    add("--lr", type=float, default=2e-4, help="GRPO learning rate (LoRA)")
    add("--sft-lr", type=float, default=1e-3, help="learning rate of the warm start, sft_more and rft (LoRA)")
    add("--rft-min-reward", type=float, default=spec.rft_min_reward, help="RFT keeps samples with reward >= this")
    add("--rft-keep", choices=("all", "best"), default=spec.rft_keep,
        help="RFT keeps every sample >= the threshold, or each prompt's best one above its group's mean")  # fmt: skip
    add("--warm-steps", type=int, default=8, help="SFT steps of the warm start")
    add("--warm-tasks", type=int, default=8, help="expert demonstrations per warm-start step")
    add("--normalize-std", action="store_true", help="GRPO: std-normalised advantages (default: Dr. GRPO)")
    add("--dynamic-sampling", action="store_true", help="GRPO: DAPO dynamic sampling")
    add("--overlong-filter", action="store_true", help="GRPO: no loss on episodes a token cap cut; RFT: none cloned")
    add("--max-new-tokens", type=int, default=spec.max_new_tokens)
    add("--eval-tasks", type=int, default=128, help="distinct held-out tasks (the standard needs >= 64)")
    add("--eval-samples", type=int, default=spec.eval_samples, help="held-out samples per task (pass@K)")
    add("--device", default="auto")
    add("--dtype", default="auto", help="weights dtype (auto: bfloat16 where the hardware accelerates it)")
    add("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    add("--env-kwargs", type=json.loads, default={}, help="JSON object of env settings over the study's own, e.g. "
        '\'{"format_credit": 0.1}\' (recorded with every run)')  # fmt: skip
    add("--start-seeds", type=int, nargs="*", default=None,
        help="seeds whose start is evaluated and recorded (default: every seed). Without warm start the start is "
             "the base model, which differs between seeds only in its evaluation samples")  # fmt: skip


def _env_kwargs(spec: LadderSpec, args: argparse.Namespace) -> dict[str, Any]:
    return {**dict(spec.env_kwargs), **args.env_kwargs, "num_held_out": args.eval_tasks}


def base_config(spec: LadderSpec, args: argparse.Namespace, seed: int, model: str, run_dir: Path) -> dict[str, Any]:
    """Fields every stage shares (model, env, episode limits, seed)."""
    return {"run_dir": str(run_dir), "model": model, "finetune": "lora", "lora.rank": 16, "lora.alpha": 32.0,
            "env": spec.env, "env_kwargs": _env_kwargs(spec, args), "split": "train", "rollout.max_turns": 1,
            "rollout.max_new_tokens": args.max_new_tokens, "rollout.temperature": 1.0, "device": args.device,
            "dtype": args.dtype,
            "seed": seed, "steps": args.max_steps, "progress": False, "checkpoint_every": 0,
            "eval_every": 0}  # fmt: skip


def arm_configs(spec: LadderSpec, args: argparse.Namespace, base: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each trained arm's TrainConfig: GRPO, the RFT matched to it, and SFT on as many demonstrations per step."""
    options = {"algo.normalize_std": args.normalize_std, "dynamic_sampling": args.dynamic_sampling,
               "overlong_filter": args.overlong_filter}  # fmt: skip
    rl = grpo_config(base, lr=args.lr, tasks_per_step=args.tasks_per_step, group_size=args.group_size, **options)
    return {
        "grpo": rl,
        "rft": rft_config(rl, min_reward=args.rft_min_reward, lr=args.sft_lr, keep=args.rft_keep),
        "sft_more": sft_config(base, lr=args.sft_lr, tasks_per_step=args.tasks_per_step * args.group_size),
    }


def _outcome(result: dict[str, Any], tasks: list[Any]) -> dict[str, Any]:
    """A held-out result as a record's outcome: estimates as {value, ci}, the chance baseline where tasks know it."""
    out: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, dict) and "low" in value:
            out["reward" if key == "mean_reward" else key] = {
                "value": value["value"], "ci": [value["low"], value["high"]] if value["low"] is not None else None}
        else:
            out[key] = value
    chance = [t.info["chance_rate"] for t in tasks if "chance_rate" in (t.info or {})]
    if chance:
        out["chance_pass@1"] = sum(chance) / len(chance)
        for k in result.get("pass_ks", ()):
            out[f"chance_pass@{k}"] = sum(1 - (1 - p) ** k for p in chance) / len(chance)
    return out


def _evaluate(spec: LadderSpec, args: argparse.Namespace, trainer: Any, tasks: list[Any], seed: int,
              name: str) -> dict[str, Any]:  # fmt: skip
    from taskrl.env import make

    kwargs = _env_kwargs(spec, args)
    pass_ks = sorted({*(k for k in spec.pass_ks if k <= args.eval_samples), args.eval_samples})
    result = held_out(trainer, lambda: make(spec.env, **kwargs), tasks, samples=args.eval_samples,
                      temperature=spec.eval_temperature, max_new_tokens=args.max_new_tokens,
                      success_threshold=spec.success_threshold, pass_ks=pass_ks, seed=seed, name=name)  # fmt: skip
    result["pass_ks"] = pass_ks
    return _outcome(result, tasks)


def _start(spec: LadderSpec, args: argparse.Namespace, seed: int, model: str, work: Path) -> tuple[str, dict]:
    """The arms' common start: the SFT warm start merged into the base (``work/start``), or the base model."""
    if not spec.warm_start:
        return model, {}
    config = sft_config({**base_config(spec, args, seed, model, work / "warm"), "steps": args.warm_steps},
                        lr=args.sft_lr, tasks_per_step=args.warm_tasks)  # fmt: skip
    trainer, budget = train_arm(config, minutes=float("inf"))
    try:
        merged = trainer.learner.model.merge_and_unload()
        merged.save_pretrained(str(work / "start"))
        trainer.learner_policy.chat_format.tokenizer.save_pretrained(str(work / "start"))
    finally:
        trainer.close()
    return str(work / "start"), {"warm_start": {**budget, "config": config}}


def run_seed(spec: LadderSpec, args: argparse.Namespace, seed: int, study: Study, model: str) -> list[Path]:
    """One seed: the start, then each arm from it; one new record per evaluated arm. Returns the record paths."""
    from taskrl.env import make
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    tasks = list(make(spec.env, **_env_kwargs(spec, args)).tasks(args.split))
    distinct = Study.check_held_out(tasks)
    work = Path(args.work_dir) / f"{args.design}-s{seed}-{args.split}-{time.strftime('%Y%m%dT%H%M%S')}"
    evaluate_start = args.start_seeds is None or seed in args.start_seeds
    arms = ["start"] * evaluate_start + [a for a in args.arms if a != "start"]
    if args.split == "test":
        for arm in arms:  # every claim before any training: a refused one costs nothing
            study.claim_test(args.design, arm, seed)
    began = time.monotonic()
    start, warm = _start(spec, args, seed, model, work)
    paths = []
    common = {"design_args": vars(args), "held_out_tasks": distinct, "baseline_arm": "rft",
              "start_model": start, **warm}  # fmt: skip
    if evaluate_start:
        base = base_config(spec, args, seed, start, work / "start_eval")
        trainer = Trainer(config_from_dict({**base, "algo.name": "sft", "sft_data": "policy"}))
        try:
            outcome = _evaluate(spec, args, trainer, tasks, seed, "start")
        finally:
            trainer.close()
        del trainer  # held until the next arm's trainer returned: two arms' models and optimizers at once
        release_freed()
        budget = {"train_s": time.monotonic() - began, "steps": 0}
        paths.append(study.record(design=args.design, arm="start", seed=seed, split=args.split, outcome=outcome,
                                  primary=spec.primary, config=base, budget=budget, engine=ENGINE, extra=common))
    configs = arm_configs(spec, args, base_config(spec, args, seed, start, work))
    for arm in [a for a in arms if a != "start"]:
        config = {**configs[arm], "run_dir": str(work / arm)}
        trainer, budget = train_arm(config, minutes=args.minutes)
        try:
            outcome = _evaluate(spec, args, trainer, tasks, seed, arm)
        finally:
            trainer.close()
        del trainer
        release_freed()  # the next arm starts from the memory this one held, not beside it
        paths.append(study.record(design=args.design, arm=arm, seed=seed, split=args.split, outcome=outcome,
                                  primary=spec.primary, config=config, budget=budget, engine=ENGINE, extra=common))
        print(f"seed {seed} {arm}: {spec.primary} {outcome[spec.primary]} budget {json.dumps(budget)[:200]}")
    return paths


def main(spec: LadderSpec, argv: list[str] | None = None, description: str = "") -> list[Path]:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, spec)
    args = parser.parse_args(argv)
    if not isinstance(args.env_kwargs, dict):
        parser.error(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    study = Study(spec.study, args.runs_dir)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    model = model_dir(args.model_path, Path(args.work_dir))
    paths = []
    for seed in args.seeds:
        paths += run_seed(spec, args, seed, study, model)
    return paths
