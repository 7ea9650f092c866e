"""HFPolicy decode throughput: N concurrent requests batched vs the same requests one at a time.

Both sides use SmolLM2-135M-Instruct with greedy decoding on the same prompts, in one run, and must
produce identical tokens; only the scheduling differs.

    .venv/bin/python benchmarks/hf_batching.py [--requests 8] [--tokens 64] [--device auto] [--engine static]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.types import Message


async def run(policy: HFPolicy, prompts: list[list[int]], sampling: SamplingParams, batched: bool):
    start = time.perf_counter()
    if batched:
        outs = await asyncio.gather(*(policy.generate(token_ids=p, sampling=sampling) for p in prompts))
    else:
        outs = [await policy.generate(token_ids=p, sampling=sampling) for p in prompts]
    return time.perf_counter() - start, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--engine", default="continuous", choices=["continuous", "static"])
    args = ap.parse_args()
    policy = HFPolicy.from_pretrained("smollm2", device=args.device, engine_config=EngineConfig(engine=args.engine))
    questions = ["Name a prime number.", "What is a tool call?", "Describe the sea.", "Count to five."]
    prompts = [
        policy.chat_format.prompt_ids([Message("user", f"{questions[i % 4]} (#{i})")]) for i in range(args.requests)
    ]
    # ignore the end-of-turn token so every request decodes exactly --tokens tokens
    policy.chat_format.stop_token_ids = set()
    sampling = SamplingParams(max_new_tokens=args.tokens, temperature=0.0)
    asyncio.run(run(policy, prompts[:1], SamplingParams(max_new_tokens=4, temperature=0.0), True))  # warm-up
    one_s, one = asyncio.run(run(policy, prompts, sampling, batched=False))
    batch_s, batch = asyncio.run(run(policy, prompts, sampling, batched=True))
    same = sum(a.token_ids == b.token_ids for a, b in zip(one, batch, strict=True))
    total = sum(len(c.token_ids) for c in batch)
    print(f"SmolLM2-135M on {policy.device}, {args.engine} engine: {args.requests} x {args.tokens} greedy tokens")
    print(f"{'schedule':16} {'seconds':>8} {'tokens/s':>9}")
    print(f"{'one at a time':16} {one_s:8.2f} {total / one_s:9.1f}")
    print(f"{'batched':16} {batch_s:8.2f} {total / batch_s:9.1f}")
    print(f"speed-up {one_s / batch_s:.2f}x; identical outputs {same}/{args.requests}")


if __name__ == "__main__":
    main()
