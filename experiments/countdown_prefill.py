"""Would an assistant prefill start Countdown RL at 135M? (docs/experiments/countdown.md)

Samples the base SmolLM2-135M on held-out Countdown tasks with ``PREFIX`` appended to the prompt's token ids (the
assistant's turn already open inside the answer tags, as TinyZero's prompts end inside ``<think>``), and counts how
many samples close the tag, are valid expressions over the given numbers, and reach the target.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python experiments/countdown_prefill.py [--tasks 64] [--samples 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default="<answer>")
    ap.add_argument("--split", default="val", choices=("val", "test"))
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--env-kwargs", type=json.loads, default={}, help='e.g. \'{"num_numbers": 2}\'')
    args = ap.parse_args()
    import torch

    from taskrl.env import make
    from taskrl.envs.countdown import ExpressionError, check_expression, parse_answer
    from taskrl.policies.base import SamplingParams
    from taskrl.policies.hf import HFPolicy
    from taskrl.policies.precision import weights_dtype
    from taskrl.types import Message

    torch.set_num_threads(args.threads)
    env = make("countdown", **args.env_kwargs)
    tasks = list(env.tasks(args.split))[: args.tasks]
    policy = HFPolicy.from_pretrained("smollm2", device="cpu", dtype=weights_dtype("auto", "cpu")[0])
    fmt = policy.chat_format
    prefix_ids = fmt.tokenizer.encode(args.prefix, add_special_tokens=False) if args.prefix else []

    async def sample() -> list[tuple[object, str]]:
        jobs = []
        for i, task in enumerate(tasks):
            ids = fmt.prompt_ids([Message("system", env.system_prompt), Message("user", task.prompt)]) + prefix_ids
            for k in range(args.samples):
                sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=i * 1000 + k)
                jobs.append(policy.generate(token_ids=ids, sampling=sampling))
        done = await asyncio.gather(*jobs)
        return [(tasks[j // args.samples], args.prefix + c.text) for j, c in enumerate(done)]

    closed = valid = solved = 0
    started = time.perf_counter()
    samples = asyncio.run(sample())
    seconds = time.perf_counter() - started
    for task, text in samples:
        answer = parse_answer(text)
        closed += answer is not None
        try:
            solved += answer is not None and check_expression(answer, task.info["numbers"], task.info["target"])
            valid += answer is not None
        except ExpressionError:
            pass
    print(f"prefix {args.prefix!r}, {len(samples)} samples ({len(tasks)} {args.split} tasks x {args.samples}, T=1, "
          f"{args.max_new_tokens} new tokens, {args.env_kwargs or 'default env'}): closed the tag {closed}, valid "
          f"expressions {valid}, solved {solved}; chance rate of a random expression "
          f"{sum(t.info['chance_rate'] for t, _ in samples) / len(samples):.3f}; sampled in {seconds:.0f} s")


if __name__ == "__main__":
    main()
