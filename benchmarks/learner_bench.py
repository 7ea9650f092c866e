"""Learner benchmark (issue 13, fifth pass): one GRPO update on ``make demo``'s logged batches, the optimizer step's
shared prompt run once (``StepPrefix``, the default) vs once per micro-batch (the learner before it), side by side.

Needs a finished ``make demo`` (its ``runs/demo/start`` warm start and ``runs/demo/grpo`` trajectories). For each
logged GRPO batch and mode: forward tokens and update seconds (best of ``--rounds``, the learner's weights and
optimizer restored before every update, so each times the same work); then, in fp32 and bf16, the relative
difference between the two modes' gradients (a non-zero LoRA adapter, so the prompt's K/V depend on what trains).

    PYTHONPATH=. HF_HUB_OFFLINE=1 MALLOC_ARENA_MAX=2 .venv/bin/python benchmarks/learner_bench.py --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine_bench import cpu_model
from taskrl.policies.hf import HFPolicy
from taskrl.policies.precision import weights_dtype
from taskrl.runlog import read_trajectories
from taskrl.training.config import TrainConfig, config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model


def learner_for(run: Path, config: TrainConfig, dtype: torch.dtype, adapter_std: float = 0.0) -> Learner:
    torch.manual_seed(0)
    policy = HFPolicy.from_pretrained(str(run / "start"), dtype=dtype)
    model = prepare_model(policy.model, config)
    if adapter_std:
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=adapter_std, generator=torch.Generator().manual_seed(len(name)))
    return Learner(model, config, pad_id=policy._pad_id)


def timing(run: Path, config: TrainConfig, rounds: int) -> dict[str, Any]:
    learner = learner_for(run, config, weights_dtype(config.dtype, config.device)[0])
    batches = read_trajectories(run / "grpo")
    state = {k: v.clone() for k, v in learner.trainable_state().items()}
    optimizer = copy.deepcopy(learner.optimizer.state_dict())
    out: dict[str, Any] = {}
    for _ in range(rounds):
        for step, batch in sorted(batches.items()):
            for mode in ("per_micro_batch", "step_prefix"):
                learner.step_prefix = mode == "step_prefix"
                learner.version = 0  # the logged batch is never stale
                learner.load_trainable_state(state)
                learner.optimizer.load_state_dict(optimizer)
                began = time.perf_counter()
                metrics = learner.update(batch, step=1)
                row = out.setdefault(f"{step}/{mode}", {"update_s": float("inf")})
                row["update_s"] = min(row["update_s"], time.perf_counter() - began)
                row["forward_tokens"] = metrics["charts/forward_tokens"]
    return out


def gradient_gap(run: Path, config: TrainConfig) -> dict[str, float]:
    batch = min(read_trajectories(run / "grpo").items())[1]
    grads: dict[tuple[str, bool], torch.Tensor] = {}
    for dtype in ("float32", "bfloat16"):
        for prefix in (False, True):
            learner = learner_for(run, config, getattr(torch, dtype), adapter_std=0.02)
            learner.step_prefix = prefix
            captured: list[torch.Tensor] = []
            step = learner.optimizer.step

            def spy(
                *args: Any, _learner: Learner = learner, _step: Any = step, _out: list = captured, **kwargs: Any
            ) -> Any:
                _out.append(torch.cat([p.grad.flatten().float() for p in _learner.params]))
                return _step(*args, **kwargs)

            learner.optimizer.step = spy  # type: ignore[method-assign]
            learner.update(batch, step=1)
            grads[(dtype, prefix)] = captured[0]

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / a.norm())

    return {
        "fp32 step prefix vs per micro-batch": rel(grads[("float32", False)], grads[("float32", True)]),
        "bf16 step prefix vs per micro-batch": rel(grads[("bfloat16", False)], grads[("bfloat16", True)]),
        "bf16 vs fp32, per micro-batch": rel(grads[("float32", False)], grads[("bfloat16", False)]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=Path("runs/demo"), help="a finished `make demo`'s run dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not (args.run_dir / "start").is_dir() or not (args.run_dir / "grpo" / "trajectories").is_dir():
        raise SystemExit(f"{args.run_dir}: no warm start or GRPO trajectories; run `make demo` first")
    config = config_from_dict(json.loads((args.run_dir / "grpo" / "config.json").read_text()))
    print(f"machine: {cpu_model()}", flush=True)
    rows = timing(args.run_dir, config, args.rounds)
    print(f"\n{'batch/mode':28} {'forward tokens':>15} {'update s (best)':>16}")
    for name, row in rows.items():
        print(f"{name:28} {row['forward_tokens']:>15.0f} {row['update_s']:>16.2f}")
    for step in sorted({name.split("/")[0] for name in rows}):
        before, after = rows[f"{step}/per_micro_batch"], rows[f"{step}/step_prefix"]
        print(f"batch {step}: step prefix {before['update_s'] / after['update_s']:.2f}x faster, "
              f"{1 - after['forward_tokens'] / before['forward_tokens']:.0%} fewer forward tokens")  # fmt: skip
    for name, value in gradient_gap(args.run_dir, config).items():
        print(f"gradient relative difference, {name}: {value:.2e}")
    print(f"machine at the end: {cpu_model()}")


if __name__ == "__main__":
    main()
