"""GRPO step time and peak memory: taskrl's Trainer vs TRL's GRPOTrainer on the same work, side by side.

Same model (SmolLM2-135M-Instruct from taskrl's local safetensors cache; nothing is downloaded), same
single-turn prompts (system + user, taken in order), 8 samples of one prompt per step, at most 64 completion
tokens at temperature 1, the same Python reward of the completion text, the same learning rate, no KL
(beta 0), one optimizer step per batch, float32; full fine-tuning, then LoRA with the same rank, alpha and
target modules. Each framework x mode runs in a fresh child process with the same torch thread count; a step's
time is the wall time between consecutive step ends (generation, scoring, backward, optimizer, logging),
median over the timed steps after the warm-up, with the process CPU seconds beside it; memory is the child's
peak RSS (VmHWM). Load on the machine inflates both times (TRL's more): compare runs on a quiet machine.

    .venv/bin/python benchmarks/grpo_vs_trl.py [--modes full,lora] [--settings fp32,best] [--warmup 1] [--steps 3]

``--settings``: ``fp32`` is the like-for-like run above; ``best`` runs each framework at its best settings on this
machine: taskrl with ``learner_precision="auto"`` (bf16 autocast over fp32 weights where the CPU/GPU accelerates
bf16, else fp32) and ``gradient_checkpointing=true``; TRL with ``bf16=True`` and its defaults (its gradient
checkpointing is on by default). The script prints the CPU model and whether amx_bf16/avx512_bf16 are present.

Needs trl (pip install 'taskrl[bench]'). TRL keeps its documented GRPOConfig defaults elsewhere, notably
gradient checkpointing on (``--trl-no-gradient-checkpointing`` turns it off) and std-scaled group advantages
(taskrl is set to the same scaling). taskrl keeps zero-variance groups here (the reward is continuous anyway) so
it never skips an update TRL would make.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from taskrl.env import ToolEnv
from taskrl.training.config import TrainConfig, config_from_dict
from taskrl.training.data import TaskSampler
from taskrl.types import Task, Trajectory

SYSTEM = "You are a helpful assistant."
PROMPTS = [
    "Write a short paragraph about the ocean.",
    "Describe how a bicycle works.",
    "Explain why the sky is blue.",
    "Tell a short story about a lost key.",
    "List some uses of a paperclip and explain each.",
    "Describe a busy market in the morning.",
    "Explain how bread is made.",
    "Write a letter to a friend about your weekend.",
]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def reward_of(text: str) -> float:
    """The shared reward: distinct words per 64 tokens of budget (continuous, so groups are never flat)."""
    return len(set(text.lower().split())) / 64.0


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- taskrl ----------------------------------------------------------------------------------------
class PromptEnv(ToolEnv):
    """Single-turn, no tools: the benchmark's prompts, scored by ``reward_of`` on the answer."""

    name = "bench_prompts"
    system_prompt = SYSTEM

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(id=f"p{i}", prompt=p) for i, p in enumerate(PROMPTS)]

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"distinct_words": reward_of(trajectory.final_answer or "")}


class InOrder(TaskSampler):
    """Prompts in list order, one per step, as TRL's unshuffled sampler takes them (rewards change nothing)."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks, self.position = tasks, 0

    def sample(self, step: int, n: int, rng: Any) -> list[Task]:
        out = [self.tasks[(self.position + i) % len(self.tasks)] for i in range(n)]
        self.position += n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


def taskrl_config(args: argparse.Namespace, mode: str, run_dir: str, setting: str = "fp32") -> TrainConfig:
    """The taskrl side of the comparison; every field the comparison fixes is set here explicitly."""
    best = setting == "best"
    return config_from_dict(
        {
            "run_dir": run_dir,
            "seed": args.seed,
            "steps": 10_000,
            "checkpoint_every": 0,
            "progress": False,
            "device": args.device,
            "model": "smollm2",
            "dtype": "float32",
            "finetune": mode,
            "lora.rank": args.lora_rank,
            "lora.alpha": float(args.lora_alpha),
            "lora.targets": list(LORA_TARGETS),
            "env": PromptEnv.name,
            "rollout.tasks_per_step": 1,
            "rollout.group_size": args.group_size,
            "rollout.max_turns": 1,
            "rollout.max_new_tokens": args.max_completion_length,
            "rollout.temperature": 1.0,
            "rollout.concurrency": args.group_size,
            "algo.name": "grpo",
            "lr": args.lr,
            "algo.normalize_std": True,
            "algo.drop_zero_variance": False,
            "learner_precision": "auto" if best else "float32",
            "gradient_checkpointing": best,
        }
    )


def run_taskrl(args: argparse.Namespace, mode: str, setting: str = "fp32") -> dict[str, Any]:
    import tempfile

    from taskrl.training.trainer import Trainer

    ends: list[tuple[float, float]] = []
    tokens, rewards = [], []
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl_") as run_dir:
        config = taskrl_config(args, mode, run_dir, setting)
        trainer = Trainer(config, env_factory=PromptEnv, task_sampler=InOrder(list(PromptEnv().tasks())))
        try:
            ends.append(_clock())
            for step in range(args.warmup + args.steps):
                (metrics,) = trainer.train(until=step + 1)
                ends.append(_clock())
                tokens.append(metrics["charts/sampled_tokens"])
                rewards.append(metrics["rewards/total"])
        finally:
            trainer.close()
    return _result(args, ends, tokens, rewards)


# -- TRL -------------------------------------------------------------------------------------------
def run_trl(args: argparse.Namespace, mode: str, setting: str = "fp32") -> dict[str, Any]:
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise SystemExit(f"TRL is not installed ({e}); pip install 'taskrl[bench]' to run this benchmark") from None
    from taskrl.policies.models import smollm2_cache_path

    ends: list[tuple[float, float]] = []
    tokens: list[float] = []
    rewards: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            ends.append(_clock())

        def on_log(self, *_: Any, logs: dict[str, float] | None = None, **__: Any) -> None:
            if logs and "completions/mean_length" in logs:
                tokens.append(logs["completions/mean_length"] * args.group_size)
                rewards.append(logs["reward"])

    def reward_func(completions: list[Any], **_: Any) -> list[float]:
        return [reward_of(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    path = str(smollm2_cache_path())
    dataset = Dataset.from_list([{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}]}
                                 for p in PROMPTS])  # fmt: skip
    config = GRPOConfig(
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "grpo_vs_trl_trl"),
        use_cpu=args.device == "cpu",
        bf16=setting == "best",  # autocast over the fp32 weights (model_init_kwargs below)
        fp16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        max_steps=args.warmup + args.steps,
        seed=args.seed,
        learning_rate=args.lr,
        per_device_train_batch_size=args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        beta=0.0,
        num_iterations=1,
        shuffle_dataset=False,  # prompts in list order, as the taskrl run takes them
        gradient_checkpointing=not args.trl_no_gradient_checkpointing,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32"},
    )
    peft_config = None
    if mode == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                                 target_modules=list(LORA_TARGETS), bias="none", task_type="CAUSAL_LM")  # fmt: skip
    trainer = GRPOTrainer(
        model=path, reward_funcs=[reward_func], args=config, train_dataset=dataset, peft_config=peft_config
    )
    trainer.add_callback(Timer())
    ends.append(_clock())
    trainer.train()
    return _result(args, ends, tokens, rewards)


def _clock() -> tuple[float, float]:
    """(wall, CPU of this process over all its threads): CPU seconds stay comparable on a loaded machine."""
    return time.perf_counter(), time.process_time()


def _result(
    args: argparse.Namespace, ends: list[tuple[float, float]], tokens: list[float], rewards: list[float]
) -> dict[str, Any]:
    durations = [b[0] - a[0] for a, b in zip(ends, ends[1:], strict=False)]
    cpu = [b[1] - a[1] for a, b in zip(ends, ends[1:], strict=False)]
    timed = durations[args.warmup :]
    timed_tokens = tokens[args.warmup :]
    return {
        "step_s": statistics.median(timed),
        "step_times_s": durations,
        "cpu_s": statistics.median(cpu[args.warmup :]),
        "cpu_times_s": cpu,
        "tokens_per_step": statistics.mean(timed_tokens) if timed_tokens else float("nan"),
        "tokens_per_s": sum(timed_tokens) / sum(timed) if timed_tokens else float("nan"),
        "reward": statistics.mean(rewards[args.warmup :]) if rewards[args.warmup :] else float("nan"),
        "peak_rss_mb": _peak_rss_mb(),
    }


# -- driver ----------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    framework, mode, setting = args.child.split(":")
    result = (run_taskrl if framework == "taskrl" else run_trl)(args, mode, setting)
    if args.device.startswith("cuda"):
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    Path(args.child_out).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="full,lora", help="comma-separated: full, lora")
    ap.add_argument("--settings", default="fp32,best", help="comma-separated: fp32 (like for like), best")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (the median is reported)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in every child (0: all CPUs)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lora-alpha", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu (TRL use_cpu=True) or cuda")
    ap.add_argument("--trl-no-gradient-checkpointing", action="store_true",
                    help="turn off TRL's default gradient checkpointing")  # fmt: skip
    ap.add_argument("--frameworks", default="trl,taskrl", help="comma-separated: trl, taskrl (both by default)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.warmup < 0 or args.steps < 1:
        ap.error("--warmup must be >= 0 and --steps >= 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("full", "lora") for m in modes):
        ap.error(f"--modes: choose from full, lora (got {args.modes!r})")
    settings = [x.strip() for x in args.settings.split(",") if x.strip()]
    if not settings or any(x not in ("fp32", "best") for x in settings):
        ap.error(f"--settings: choose from fp32, best (got {args.settings!r})")
    args.threads = args.threads or os.cpu_count() or 1
    if args.child:
        child(args)
        return
    import importlib.util

    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    if not frameworks or any(f not in ("trl", "taskrl") for f in frameworks):
        ap.error(f"--frameworks: choose from trl, taskrl (got {args.frameworks!r})")
    if "trl" in frameworks and importlib.util.find_spec("trl") is None:
        sys.exit("TRL is not installed: pip install 'taskrl[bench]' (trl) to compare against GRPOTrainer")
    results: dict[tuple[str, str], dict[str, Any]] = {}
    out_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    print(cpu_line(), flush=True)
    runs = [(mode, setting) for setting in settings for mode in modes]
    for mode, setting in runs:
        for framework in frameworks:
            key = f"{mode}/{setting}"
            out = out_dir / f"grpo_vs_trl_{framework}_{mode}_{setting}_{os.getpid()}.json"
            child_arg = f"{framework}:{mode}:{setting}"
            cmd = [sys.executable, __file__, *sys.argv[1:], "--child", child_arg, "--child-out", str(out)]
            print(f"running {framework} ({key}) ...", flush=True)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if done.returncode != 0:
                sys.exit(f"{framework} ({key}) failed:\n{done.stdout[-4000:]}")
            results[(framework, key)] = json.loads(out.read_text())
            out.unlink()
            result = results[(framework, key)]
            wall = ", ".join(f"{t:.1f}" for t in result["step_times_s"])
            cpu = ", ".join(f"{t:.1f}" for t in result["cpu_times_s"])
            print(f"  per step: wall s {wall}; CPU s {cpu}; load average {os.getloadavg()[0]:.1f}")
    print(
        f"\nSmolLM2-135M-Instruct, {args.device}, {args.threads} threads, 1 prompt x {args.group_size} samples x "
        f"<= {args.max_completion_length} tokens, median of {args.steps} steps after {args.warmup} warm-up"
    )
    print(
        f"{'mode':10} {'TRL s/step':>10} {'taskrl s/step':>13} {'speed-up':>8} {'TRL CPU s':>9} {'taskrl CPU s':>12} "
        f"{'CPU ratio':>9} {'TRL MB':>7} {'taskrl MB':>9} {'mem ratio':>9} {'TRL tok/step':>12} "
        f"{'taskrl tok/step':>15} {'TRL tok/s':>9} {'taskrl tok/s':>12}"
    )
    for mode in (f"{m}/{x}" for m, x in runs):
        trl, ours = results.get(("trl", mode)), results.get(("taskrl", mode))
        if trl is None or ours is None:  # one framework only (--frameworks)
            for name, alone in (("TRL", trl), ("taskrl", ours)):
                if alone is not None:
                    print(f"{mode:10} {name}: {alone['step_s']:.2f} s/step, {alone['cpu_s']:.1f} CPU s/step, "
                          f"{alone['peak_rss_mb']:.0f} MB, {alone['tokens_per_step']:.0f} tokens/step")  # fmt: skip
            continue
        print(
            f"{mode:10} {trl['step_s']:10.2f} {ours['step_s']:13.2f} {trl['step_s'] / ours['step_s']:7.2f}x "
            f"{trl['cpu_s']:9.1f} {ours['cpu_s']:12.1f} {trl['cpu_s'] / ours['cpu_s']:8.2f}x "
            f"{trl['peak_rss_mb']:7.0f} {ours['peak_rss_mb']:9.0f} {ours['peak_rss_mb'] / trl['peak_rss_mb']:9.2f} "
            f"{trl['tokens_per_step']:12.0f} {ours['tokens_per_step']:15.0f} {trl['tokens_per_s']:9.1f} "
            f"{ours['tokens_per_s']:12.1f}"
        )
    print(
        "speed-up = TRL s/step / taskrl s/step (wall); CPU ratio = the same in process CPU seconds (load inflates "
        "both: OpenMP threads spin under contention, so trust a quiet run); mem ratio = taskrl / TRL peak RSS "
        "(lower is better); fp32 = both in float32 (TRL with its default gradient checkpointing); best = taskrl "
        "learner_precision=auto + gradient_checkpointing, TRL bf16=True + defaults"
    )


def cpu_line() -> str:
    """The CPU model (lscpu) and whether it has bf16 instructions: the benchmark's numbers depend on both."""
    from taskrl.policies.precision import BF16_CPU_FLAGS, cpu_flags

    model = "unknown CPU"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
                     model)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass
    flags = ", ".join(f"{flag} {'yes' if flag in cpu_flags() else 'no'}" for flag in BF16_CPU_FLAGS)
    return f"CPU: {model} ({os.cpu_count()} CPUs; {flags}); load average {os.getloadavg()[0]:.1f}"


if __name__ == "__main__":
    main()
