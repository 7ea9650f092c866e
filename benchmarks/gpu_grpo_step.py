"""The trainer's real GRPO step on a random-init Qwen3-shaped model, on the device chosen at run time (issue 36 item 7).

No download and no weights: the model is built from a config (``--model-size 0.5b``: Qwen3-0.6B's shape, 28 layers,
hidden 1024, 16 query / 8 KV heads of 128, MLP 3072, tied embeddings, with SmolLM2's 49,152-token vocabulary, so
about 0.49B parameters; ``tiny``: the same architecture at toy size, for CPU tests). ``taskrl.training.trainer.Trainer``
runs full fine-tuning exactly as ``taskrl train`` would: fp32 master weights with the learner in bf16 autocast
(``learner_precision="bfloat16"``), rollouts sampled by a bf16 copy synced after every update
(``rollout_policy="copy"``), ``--prompts`` x ``--samples`` single-turn episodes per step of up to
``--max-new-tokens`` tokens at temperature 1 (a random model almost never stops early), every group kept.

Per timed step (after ``--warmup`` untimed ones) it takes the trainer's own metrics and reports:
- learner tokens/s: tokens trained on (sampled, loss-masked) per second of the update;
- learner forward tokens/s: every token the update's forward/backward processed (prompt prefixes once per step);
  this is the like-for-like number for prime-rl's published 11.9k tokens/s (Qwen3-0.6B, full fine-tuning, one
  H100 HBM3, trainer-only ``--bench`` mode on packed 16,384-token sequences with activation recompute and FA3);
- rollout tokens/s: sampled tokens per second of the rollout phase;
- MFU: 6 x parameters x forward tokens / update seconds / the GPU's dense bf16 peak (a table keyed by GPU name,
  or ``--peak-tflops``); attention's own FLOPs are not counted, so it is a lower bound; n/a on CPU.

    python benchmarks/gpu_grpo_step.py --device auto --model-size 0.5b --steps 3 --json gpu_grpo_step.json
    python benchmarks/gpu_grpo_step.py --device cpu --model-size tiny --steps 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from grpo_vs_trl import PROMPTS, PromptEnv
from rich.console import Console

from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.policies.models import resolve_device, smollm2_tokenizer
from taskrl.training.config import TrainConfig, config_from_dict
from taskrl.training.trainer import Trainer
from taskrl.types import Task

PRIME_RL_TOKENS_PER_S = 11_900.0
"""prime-rl's published trainer throughput: Qwen3-0.6B, RL full fine-tuning, one H100 HBM3 (benchmarks/results)."""
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("A100", 312.0),
)
"""Dense bf16 peak TFLOP/s by GPU name, first substring match wins (the more specific names come first)."""
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16},
    "0.5b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128},
}  # fmt: skip
"""Model shapes: ``0.5b`` is Qwen3-0.6B's (its 151,936-token vocabulary replaced by SmolLM2's tokenizer)."""
DEFAULTS: dict[str, dict[str, int]] = {
    "tiny": {"prompts": 2, "samples": 2, "max_new_tokens": 16, "micro_batch_tokens": 4096},
    "0.5b": {"prompts": 16, "samples": 8, "max_new_tokens": 256, "micro_batch_tokens": 16384},
}
"""Per-size defaults of the workload flags (0.5b: prime-rl's 128 rollouts per step)."""


class BenchPromptEnv(PromptEnv):
    """``grpo_vs_trl``'s single-turn prompts and reward, 64 distinct tasks so a step's groups never share a prompt."""

    name = "bench_gpu_prompts"

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(id=f"p{i}", prompt=f"{PROMPTS[i % len(PROMPTS)]} (take {i // len(PROMPTS) + 1})")
                for i in range(64)]  # fmt: skip


def model_config(size: str, tokenizer: Any) -> Any:
    """The ``transformers.Qwen3Config`` of ``size`` (see ``SIZES``) with the tokenizer's vocabulary and ids."""
    from transformers import Qwen3Config

    if size not in SIZES:
        raise ValueError(f"--model-size must be one of {', '.join(SIZES)}, got {size!r}")
    return Qwen3Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SIZES[size],
    )


def build_model(size: str, tokenizer: Any, seed: int) -> Any:
    """A random-init ``Qwen3ForCausalLM`` in float32 (the learner's master weights), on CPU."""
    from transformers import Qwen3ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(model_config(size, tokenizer)).eval()


def peak_tflops(gpu_name: str | None) -> float | None:
    """Dense bf16 peak of a GPU by name (``PEAK_BF16_TFLOPS``); None for a CPU or a GPU not in the table."""
    if not gpu_name:
        return None
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key.lower() in gpu_name.lower()), None)


def mfu(params: int, tokens: float, seconds: float, peak: float | None) -> float | None:
    """6 x params x tokens / seconds / peak FLOP/s (forward + backward of a dense decoder); None without a peak."""
    if peak is None or seconds <= 0:
        return None
    return 6.0 * params * tokens / seconds / (peak * 1e12)


def machine() -> dict[str, str | None]:
    """``lscpu``'s model name and ``nvidia-smi``'s GPU names, where those tools exist."""
    out: dict[str, str | None] = {"cpu": None, "nvidia_smi": None}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        out["cpu"] = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                           if line.startswith("Model name")), None)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        names = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
        out["nvidia_smi"] = "; ".join(names) if smi.returncode == 0 and names else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def bench_config(args: argparse.Namespace, run_dir: str) -> TrainConfig:
    """The run: full fine-tuning, fp32 master weights + bf16 learner autocast, a bf16 rollout copy, GRPO."""
    rollouts = args.prompts * args.samples
    return config_from_dict(
        {
            "run_dir": run_dir,
            "seed": args.seed,
            "steps": 10_000,
            "checkpoint_every": 0,
            "log_trajectories": False,
            "progress": False,
            "device": args.device,
            "dtype": "float32",
            "learner_precision": "bfloat16",
            "placement.rollout_policy": "copy",
            "placement.rollout_dtype": "bfloat16",
            "finetune": "full",
            "gradient_checkpointing": args.gradient_checkpointing,
            "env": BenchPromptEnv.name,
            "rollout.tasks_per_step": args.prompts,
            "rollout.group_size": args.samples,
            "rollout.max_turns": 1,
            "rollout.max_new_tokens": args.max_new_tokens,
            "rollout.max_context_tokens": args.max_new_tokens + 512,
            "rollout.temperature": 1.0,
            "rollout.concurrency": rollouts,
            "algo.name": "grpo",
            "lr": 1e-6,
            "algo.drop_zero_variance": False,
            "micro_batch_tokens": args.micro_batch_tokens,
        }
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the model and the Trainer, run ``warmup + steps`` GRPO steps, return the measurements."""
    device = resolve_device(args.device)
    tokenizer = smollm2_tokenizer()
    model = build_model(args.model_size, tokenizer, args.seed)
    params = sum(p.numel() for p in model.parameters())
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak = args.peak_tflops or peak_tflops(gpu)
    rollouts = args.prompts * args.samples
    policy = HFPolicy(model, tokenizer, name=f"random-qwen3-{args.model_size}", device=device,
                      engine_config=EngineConfig(max_batch_size=rollouts, schedule="throughput"))  # fmt: skip
    steps: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="gpu_grpo_step_") as run_dir:
        config = bench_config(args, run_dir)
        trainer = Trainer(config, policy=policy, env_factory=BenchPromptEnv, console=Console(stderr=True))
        try:
            for step in range(args.warmup + args.steps):
                (metrics,) = trainer.train(until=step + 1)
                steps.append({
                    "timed": float(step >= args.warmup),
                    "step_s": metrics["charts/step_time_s"],
                    "rollout_s": metrics["charts/rollout_time_s"],
                    "update_s": metrics["charts/update_time_s"],
                    "sync_s": metrics.get("charts/sync_time_s", 0.0),
                    "sampled_tokens": metrics["charts/sampled_tokens"],
                    "trained_tokens": metrics["charts/trained_tokens"],
                    "forward_tokens": metrics["charts/forward_tokens"],
                    "reward": metrics["rewards/total"],
                })  # fmt: skip
        finally:
            trainer.close()
            policy.close()
    timed = [s for s in steps if s["timed"]]

    def total(key: str) -> float:
        return sum(s[key] for s in timed)

    update_s, rollout_s = total("update_s"), total("rollout_s")
    forward_per_s = total("forward_tokens") / update_s
    return {
        "device": str(device),
        "gpu": gpu,
        **machine(),
        "torch": torch.__version__,
        "model_size": args.model_size,
        "params": params,
        "precision": "fp32 master weights, bf16 learner autocast, bf16 rollout copy",
        "finetune": "full",
        "gradient_checkpointing": args.gradient_checkpointing,
        "rollouts_per_step": rollouts,
        "max_new_tokens": args.max_new_tokens,
        "warmup_steps": args.warmup,
        "timed_steps": len(timed),
        "learner_tokens_per_s": total("trained_tokens") / update_s,
        "learner_forward_tokens_per_s": forward_per_s,
        "rollout_tokens_per_s": total("sampled_tokens") / rollout_s,
        "step_tokens_per_s": total("sampled_tokens") / total("step_s"),
        "peak_bf16_tflops": peak,
        "mfu": mfu(params, total("forward_tokens"), update_s, peak),
        "prime_rl_tokens_per_s": PRIME_RL_TOKENS_PER_S,
        "vs_prime_rl": forward_per_s / PRIME_RL_TOKENS_PER_S,
        "peak_cuda_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "steps": steps,
    }


def report(result: dict[str, Any]) -> str:
    """The human-readable summary printed by ``main``."""
    mfu_text = "n/a (no GPU peak: CPU, or a GPU not in the table; see --peak-tflops)"
    if result["mfu"] is not None:
        mfu_text = f"{result['mfu']:.1%} (of {result['peak_bf16_tflops']:.0f} TFLOP/s dense bf16; 6*N*tokens)"
    memory = f"{result['peak_cuda_mb']:.0f} MiB" if result["peak_cuda_mb"] is not None else "n/a"
    lines = [
        f"CPU (lscpu): {result['cpu'] or 'unknown'}",
        f"GPU (nvidia-smi): {result['nvidia_smi'] or 'none'}",
        f"device: {result['device']} ({result['gpu'] or 'no CUDA'}), torch {result['torch']}",
        f"model: random Qwen3-shaped {result['model_size']}, {result['params'] / 1e6:.1f}M parameters, "
        f"full fine-tuning, {result['precision']}"
        + (", activation checkpointing" if result["gradient_checkpointing"] else ""),
        f"workload: {result['rollouts_per_step']} rollouts/step x <= {result['max_new_tokens']} new tokens, "
        f"{result['timed_steps']} timed step(s) after {result['warmup_steps']} warm-up",
        f"learner tokens/s (trained):       {result['learner_tokens_per_s']:12,.0f}",
        f"learner forward tokens/s:         {result['learner_forward_tokens_per_s']:12,.0f}   "
        f"prime-rl: {result['prime_rl_tokens_per_s']:,.0f} (Qwen3-0.6B, 1x H100, full FT) -> "
        f"{result['vs_prime_rl']:.2f}x",
        f"rollout tokens/s:                 {result['rollout_tokens_per_s']:12,.0f}",
        f"whole step sampled tokens/s:      {result['step_tokens_per_s']:12,.0f}",
        f"MFU (learner): {mfu_text}",
        f"peak CUDA memory: {memory}",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:1 ...")
    ap.add_argument("--model-size", choices=sorted(SIZES), default="0.5b")
    ap.add_argument("--steps", type=int, default=3, help="timed GRPO steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed GRPO steps first (CUDA start-up, allocator)")
    ap.add_argument("--prompts", type=int, help="tasks per step (default per size: tiny 2, 0.5b 16)")
    ap.add_argument("--samples", type=int, help="episodes per task (default per size: tiny 2, 0.5b 8)")
    ap.add_argument("--max-new-tokens", type=int, help="tokens sampled per episode at most (tiny 16, 0.5b 256)")
    ap.add_argument("--micro-batch-tokens", type=int, help="learner micro-batch token budget (tiny 4096, 0.5b 16384)")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations (as prime-rl's run)")
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak TFLOP/s of a GPU not in the table")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results here ('-': print only the JSON on stdout)")
    args = ap.parse_args(argv)
    for name, value in DEFAULTS[args.model_size].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("steps", "prompts", "samples", "max_new_tokens", "micro_batch_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.samples < 2:
        ap.error("--samples must be >= 2: GRPO's advantages are relative to the group")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        ap.error(f"--peak-tflops must be > 0, got {args.peak_tflops}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    result = run(args)
    result["wall_s"] = time.perf_counter() - started
    text = json.dumps(result, indent=2)
    if str(args.json) == "-":
        print(text)
        return
    print(report(result))
    if args.json is not None:
        args.json.write_text(text + "\n")
        print(f"results: {args.json}")


if __name__ == "__main__":
    main()
