"""Peak memory of one tool-use ladder arm by phase: load, each training step, the greedy held-out evaluation.

RSS is sampled every 50 ms by a thread (``psutil``); the arm is ``experiments/tool_use.py``'s stage config for the
prices3 design in float32, from a warm start the ladder made (``runs/ladder_test/sft_seed_S/start``). Extra
``field=value`` arguments (JSON values) override the arm's TrainConfig, e.g. ``gradient_checkpointing=true``.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/arm_memory.py runs/ladder_test/sft_seed_4/start grpo \\
        [gradient_checkpointing=true] [micro_batch_tokens=1024]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("start", help="the warm start's merged model directory")
    ap.add_argument("arm", choices=("sft_only", "sft3", "rft", "grpo"))
    ap.add_argument("overrides", nargs="*", help="TrainConfig field=JSON value")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import psutil
    import torch

    from experiments import tool_use
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    torch.set_num_threads(args.threads)
    process, peak = psutil.Process(), [0]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.05)

    def mark(label: str) -> None:
        print(f"{label}: rss {process.memory_info().rss / 2**30:.2f} GiB, peak {peak[0] / 2**30:.2f} GiB", flush=True)

    threading.Thread(target=sample, daemon=True).start()
    ns = argparse.Namespace(design="prices3", seed=4, sft_seed=4, dtype="float32", max_turns=3, max_new_tokens=96,
                            device="cpu", sft_lr=1e-3, lr=5e-4, tasks=3, group_size=4, entropy_coef=0.0,
                            max_steps=args.steps, sft_tasks=8, lookup_credit=0.3, sft_steps=4, rft_min_reward=1.0,
                            eval_tasks=64, sampled_samples=0, split="test", threads=args.threads)  # fmt: skip
    with tempfile.TemporaryDirectory() as run_dir:
        config = tool_use.stage_config(args.arm, Path(run_dir), Path(args.start), ns)
        config["resume"] = False
        for item in args.overrides:
            key, _, value = item.partition("=")
            config[key] = json.loads(value)
        print({k: config.get(k) for k in ("gradient_checkpointing", "micro_batch_tokens")}, flush=True)
        mark("before load")
        trainer = Trainer(config_from_dict(config))
        mark("trainer built")
        for step in range(args.steps):
            trainer.train(until=step + 1)
            mark(f"after step {step + 1}")
        tool_use.held_out(trainer, "memory_eval", ns, n=64, sampled=False)
        mark("after the greedy evaluation (64 tasks)")
        trainer.close()
    print(f"max RSS (getrusage): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
