"""Where the production service's memory goes: RSS while candidate versions are built, served and retired.

The issue-22 production benchmark's service grew by 2-3 GB per cycle even after ``Router.retire`` dropped every
unreachable version. This replays what one cycle does to memory, in one process, on SmolLM2-135M-Instruct:
``ProductionCycle._candidate`` (deep copy of the LoRA learner, merged), greedy requests on it (its KV buffers and
prefix cache fill), then ``Router.retire`` (close in a thread, drop every reference). It prints the process's RSS
after each version, side by side for two ways of ending a version:

- ``retire``: what the router did before (close, drop the references, ``gc.collect()``);
- ``retire + trim``: the router now: the same, then glibc's ``malloc_trim(0)``
  (``taskrl.policies.memory.release_freed``, called by the retire thread after the policy closes).

If the first grows and the second does not, the memory was freed by Python and torch but kept by the C allocator
(freed blocks below glibc's dynamic mmap threshold stay in the heap and its per-thread arenas).

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 python benchmarks/version_memory_bench.py --versions 4
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from experiments.tool_use import cpu_model  # noqa: E402


def rss_gb() -> float:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


async def serve(policy, requests: int, prompt_words: int, max_new_tokens: int) -> None:
    from taskrl.policies.base import SamplingParams
    from taskrl.types import Message

    async def one(i: int) -> None:
        text = " ".join(f"item{i}-{j}" for j in range(prompt_words))
        await policy.generate(messages=[Message("user", f"List these: {text}")],
                              sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))  # fmt: skip

    await asyncio.gather(*(one(i) for i in range(requests)))


def run(mode: str, args: argparse.Namespace) -> list[float]:
    import torch

    from taskrl.deploy.router import Router, RouterConfig
    from taskrl.policies.hf import HFPolicy
    from taskrl.training.config import config_from_dict
    from taskrl.training.learner import Learner
    from taskrl.training.model import is_peft, prepare_model

    torch.set_num_threads(args.threads)
    if mode == "retire":  # the router as it was: no trim after a retired policy closes
        import taskrl.deploy.router as router_module

        router_module.release_freed = gc.collect
    base = HFPolicy.from_pretrained("smollm2", device="cpu", name="m")
    config = config_from_dict({"run_dir": str(ROOT / "runs" / "version_memory"), "model": "smollm2",
                               "finetune": "lora", "lora.rank": 16, "lora.alpha": 32.0, "algo.name": "grpo",
                               "progress": False, "micro_batch_tokens": 1024})  # fmt: skip
    learner = Learner(prepare_model(base.model, config), config, pad_id=base._pad_id)
    router = Router("m", HFPolicy(copy.deepcopy(base.model), base.tokenizer, name="m-v0", device="cpu"),
                    RouterConfig())  # fmt: skip
    asyncio.run(serve(router.policy(router.stable), args.requests, args.prompt_words, args.max_new_tokens))
    gc.collect()
    samples = [rss_gb()]
    for step in range(args.versions):
        model = copy.deepcopy(learner.model)  # as ProductionCycle._candidate
        if is_peft(model):
            model = model.merge_and_unload()
        for param in model.parameters():
            param.requires_grad_(False)
        candidate = HFPolicy(model, base.tokenizer, name=f"m-cycle{step}", device="cpu")
        del model
        version = router.add_version(candidate)
        del candidate
        asyncio.run(serve(router.policy(version), args.requests, args.prompt_words, args.max_new_tokens))
        router.activate(version)
        for old in sorted(set(router.versions) - router.live_versions()):
            router.retire(old)
        deadline = time.monotonic() + 60
        while any(t.name.startswith("taskrl-retire") for t in threading.enumerate()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        gc.collect()
        samples.append(rss_gb())
        print(f"  [{mode}] after version {version}: RSS {samples[-1]:.2f} GB "
              f"(live versions {sorted(router.versions)})", flush=True)  # fmt: skip
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-words", type=int, default=120)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", choices=("retire", "retire + trim"), help="(internal) run one side")
    args = parser.parse_args()
    if args.mode:  # one side in a fresh process, so neither inherits the other's heap
        samples = run(args.mode, args)
        print("SAMPLES " + " ".join(f"{s:.3f}" for s in samples), flush=True)
        return
    print(f"CPU: {cpu_model()}; torch threads {args.threads}; {args.versions} versions x {args.requests} requests")
    rows = {}
    for mode in ("retire", "retire + trim"):
        cmd = [sys.executable, __file__, "--mode", mode, *sys.argv[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(out.stdout, end="")
        if out.returncode != 0:
            print(out.stderr[-3000:])
            raise SystemExit(out.returncode)
        line = next(line for line in out.stdout.splitlines() if line.startswith("SAMPLES "))
        rows[mode] = [float(x) for x in line.split()[1:]]
    print("\n| RSS GB after | " + " | ".join(["start", *(f"v{i + 1}" for i in range(args.versions))]) + " | growth |")
    print("|---|" + "---:|" * (args.versions + 2))
    for mode, samples in rows.items():
        cells = " | ".join(f"{s:.2f}" for s in samples)
        print(f"| {mode} | {cells} | {samples[-1] - samples[0]:+.2f} |")
    a, b = (rows[m][-1] - rows[m][0] for m in rows)
    print(f"\ngrowth over {args.versions} versions: retire {a:+.2f} GB vs retire + trim {b:+.2f} GB")


if __name__ == "__main__":
    main()
