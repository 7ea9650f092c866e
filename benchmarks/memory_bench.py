"""Learner memory per rank: DDP vs FSDP2 vs FSDP2 + activation checkpointing on SmolLM2, and the projection to 7B.

    .venv/bin/python benchmarks/memory_bench.py [--nproc 2] [--groups 2] [--samples 4] [--prompt 128] [--answer 128]

Two gloo ranks on this machine (CPU) each run one full fine-tuning GRPO update of SmolLM2-135M-Instruct on their
share of the same synthetic batch (``groups`` prompts x ``samples`` answers) under each backend in turn. Per rank
it reports the bytes it holds for parameters, gradients (just before the optimizer step) and AdamW state, counted
from the tensors themselves (a DTensor counts its local shard), and the peak bytes of all tensors alive during
the update (``taskrl.training.memory.PeakMemory``: resident state + activations + all-gathered layers + temporaries).
The same accounting, with the activation bytes per (token x layer x hidden unit) measured here, projects the
per-GPU memory of a 7B Llama (fp32 master weights + AdamW) on ``--gpus`` GPUs. CPU model and bf16 flags printed.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taskrl.distributed.ddp import DataParallel, spawn  # noqa: E402
from taskrl.training.config import TrainConfig, config_from_dict  # noqa: E402
from taskrl.training.memory import PeakMemory, optimizer_bytes, tensor_bytes  # noqa: E402
from taskrl.types import Segment, Trajectory  # noqa: E402

MB = 2**20
BACKENDS = {"ddp": {"placement.learner_backend": "ddp"}, "fsdp2": {"placement.learner_backend": "fsdp2"},
            "fsdp2+ckpt": {"placement.learner_backend": "fsdp2", "gradient_checkpointing": True}}  # fmt: skip
LLAMA_7B = {"params": 6.74e9, "hidden": 4096, "layers": 32, "intermediate": 11008, "vocab": 32000}


def batch(args: argparse.Namespace) -> list[Trajectory]:
    """``groups`` prompts x ``samples`` answers of fixed lengths, rewards varying inside each group."""
    rng = random.Random(0)
    out = []
    for g in range(args.groups):
        prompt = [rng.randrange(100, 40000) for _ in range(args.prompt)]
        for k in range(args.samples):
            segment = Segment()
            segment.append(prompt, sampled=False)
            segment.append([rng.randrange(100, 40000) for _ in range(args.answer)], sampled=True,
                           logprobs=[-10.0] * args.answer)  # fmt: skip
            out.append(Trajectory(task_id=f"t{g}", group_id=f"g{g}", segments=[segment], rewards={"r": float(k)}))
    return out


def measure(config: TrainConfig, trajectories: list[Trajectory]) -> dict[str, float]:
    """One update on this rank's share; bytes this rank holds and its peak tensor bytes during the update."""
    from taskrl.policies.models import load_smollm2
    from taskrl.training.learner import Learner
    from taskrl.training.model import prepare_model

    group = DataParallel.from_process_group()
    model = prepare_model(load_smollm2()[0], config)
    learner = Learner(model, config, pad_id=0, data_parallel=group)
    params = tensor_bytes(model.parameters())
    grads: list[int] = []
    step = learner.optimizer.step

    def spy(*a: Any, **k: Any) -> Any:
        grads.append(tensor_bytes(p.grad for p in learner.params if p.grad is not None))
        return step(*a, **k)

    learner.optimizer.step = spy  # type: ignore[method-assign]
    share = group.shard(list(range(len(trajectories) // config.rollout.group_size)))
    own = [t for g in share for t in trajectories[g * config.rollout.group_size : (g + 1) * config.rollout.group_size]]
    with PeakMemory() as peak:
        learner.update(own, step=0)
    out = {"params_mb": params / MB, "grads_mb": max(grads, default=0) / MB,
           "optimizer_mb": optimizer_bytes(learner.optimizer) / MB,
           "peak_mb": (params + peak.peak_bytes) / MB, "transient_mb": peak.peak_bytes / MB}  # fmt: skip
    learner.optimizer.state.clear()  # the next backend starts from an empty process, as far as tensors go
    gc.collect()
    return out


def rank_main(args: argparse.Namespace, trajectories: list[Trajectory]) -> dict[str, dict[str, float]]:
    base = config_from_dict({"finetune": "full", "rollout.group_size": args.samples, "lr": 1e-5, "progress": False,
                             "placement.rollout_policy": "copy",
                             "micro_batch_tokens": args.micro_batch_tokens})  # fmt: skip
    return {name: measure(base.override({**changes}), trajectories) for name, changes in BACKENDS.items()}


def activation_coefficients(args: argparse.Namespace) -> tuple[float, float]:
    """Bytes held between forward and backward per (token x layer x hidden unit), without and with checkpointing
    (the LM head's logits excluded: only sampled positions reach it, counted separately in the projection)."""
    from taskrl.policies.models import load_smollm2
    from taskrl.training.batching import collate, sequences_from
    from taskrl.training.model import enable_activation_checkpointing, forward

    model = load_smollm2()[0].train()
    config = model.config
    sequences = sequences_from(batch(argparse.Namespace(**{**vars(args), "groups": 1})))
    micro = collate(sequences, pad_id=0, share_prefix=False)
    out = []
    for checkpointing in (False, True):
        if checkpointing:
            enable_activation_checkpointing(model)
        with PeakMemory() as memory:
            result = forward(model, micro)
            held = memory.live_bytes
        del result
        logits = micro.targets.numel() * config.vocab_size * 4
        out.append((held - logits) / (micro.input_ids.numel() * config.num_hidden_layers * config.hidden_size))
    return out[0], out[1]


def projection(coefficients: tuple[float, float], gpus: int, tokens: int) -> list[tuple[str, float]]:
    """Per-GPU GB of a 7B full fine-tune (fp32 weights, fp32 grads, AdamW 2 x fp32) with ``tokens`` per micro-batch."""
    m = LLAMA_7B
    state = 16 * m["params"]  # 4 weights + 4 gradient + 8 AdamW bytes per parameter
    layer_params = 4 * m["hidden"] ** 2 + 3 * m["hidden"] * m["intermediate"]  # attention + MLP (MHA)
    gathered = 2 * 4 * layer_params  # FSDP2: the current and the prefetched layer unsharded, fp32
    logits = 3 * 4 * tokens * m["vocab"]  # logits, log-softmax, grad (upper bound: every token sampled)
    full, ckpt = coefficients
    act = full * tokens * m["layers"] * m["hidden"]
    act_ckpt = ckpt * tokens * m["layers"] * m["hidden"] + full * tokens * m["hidden"]  # + one layer recomputed
    gb = 1e9
    return [("ddp", (state + act + logits) / gb), (f"fsdp2 x{gpus}", (state / gpus + gathered + act + logits) / gb),
            (f"fsdp2+ckpt x{gpus}", (state / gpus + gathered + act_ckpt + logits) / gb)]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--groups", type=int, default=2, help="prompts in the batch (dealt whole to the ranks)")
    ap.add_argument("--samples", type=int, default=4, help="answers per prompt")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--answer", type=int, default=128)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of the 7B projection")
    ap.add_argument("--project-tokens", type=int, default=4096, help="tokens per micro-batch in the projection")
    args = ap.parse_args()
    if args.groups % args.nproc:
        ap.error("--groups must be a multiple of --nproc (every rank gets whole groups)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from grpo_vs_trl import cpu_line

    print(cpu_line(), flush=True)
    trajectories = batch(args)
    results = spawn(rank_main, args.nproc, (args, trajectories))
    tokens = args.groups // args.nproc * args.samples * (args.prompt + args.answer)
    print(f"\nSmolLM2-135M-Instruct full fine-tuning, fp32, {args.nproc} gloo ranks, {tokens} tokens per rank "
          f"({args.groups} prompts x {args.samples} answers x {args.prompt}+{args.answer} tokens)")  # fmt: skip
    print(f"{'backend':12} {'rank':>4} {'params MB':>9} {'grads MB':>8} {'AdamW MB':>8} {'state MB':>8} "
          f"{'peak MB':>8} {'transient MB':>12}")  # fmt: skip
    for name in BACKENDS:
        for rank, result in enumerate(results):
            r = result[name]
            state = r["params_mb"] + r["grads_mb"] + r["optimizer_mb"]
            print(f"{name:12} {rank:4d} {r['params_mb']:9.0f} {r['grads_mb']:8.0f} {r['optimizer_mb']:8.0f} "
                  f"{state:8.0f} {r['peak_mb']:8.0f} {r['transient_mb']:12.0f}")  # fmt: skip
    ddp, sharded = results[0]["ddp"], results[0]["fsdp2"]
    ratio = (sharded["params_mb"] + sharded["optimizer_mb"]) / (ddp["params_mb"] + ddp["optimizer_mb"])
    print(f"rank 0 parameter + AdamW bytes, fsdp2 / ddp: {ratio:.3f} (1/{args.nproc} = {1 / args.nproc:.3f})")
    coefficients = activation_coefficients(args)
    print(f"activation bytes per token x layer x hidden unit held for the backward: {coefficients[0]:.1f} "
          f"(checkpointed: {coefficients[1]:.1f})")  # fmt: skip
    print(f"\nprojected per-GPU memory, 7B Llama full fine-tuning, fp32 weights + AdamW, "
          f"{args.project_tokens} tokens per micro-batch:")  # fmt: skip
    for name, gb in projection(coefficients, args.gpus, args.project_tokens):
        print(f"  {name:16} {gb:7.1f} GB")
    print(f"(state 16 B/param = {16 * LLAMA_7B['params'] / 1e9:.0f} GB unsharded; load average "
          f"{os.getloadavg()[0]:.1f}; measured on CPU/gloo, projection not measured on GPUs)")  # fmt: skip


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
