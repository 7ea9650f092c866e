"""Swarm benchmark: a scripted fan-out orchestrator vs a single agent doing the same rows serially, on generated
wide-search tasks over the default search corpus, with the same frozen sub-agent policy on both sides.

    .venv/bin/python benchmarks/swarm_bench.py                       # 16 tasks x 8 rows, 200 ms per helper turn
    .venv/bin/python benchmarks/swarm_bench.py --tasks runs/wide.jsonl --corpus runs/corpus --latency-ms 0

The sub-agent policy is the search env's scripted rule (search every clue, then answer) plus a fixed latency per
turn standing in for a served model's decode time (a scripted rule answers in microseconds, which would hide what
a swarm saves). Episodes run one at a time so wall times do not compete. Prints critical steps, wall time and item
F1 for both, and the ratios. Targets: critical steps >= 4.5x fewer; swarm item F1 not worse.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from taskrl.envs.search.env import SearchEnv
from taskrl.envs.swarm.env import SwarmEnv, SwarmEnvConfig
from taskrl.envs.swarm.scripted import fanout_rule, serial_rule
from taskrl.policies.base import Completion, SamplingParams
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.types import Message, Trajectory


class LatentPolicy:
    """Wraps a policy and waits ``latency_s`` before each turn, like a served model's decode."""

    def __init__(self, inner: Any, latency_s: float) -> None:
        self.inner, self.latency_s = inner, latency_s
        self.name, self.version, self.chat_format = f"{inner.name}+latency", inner.version, inner.chat_format

    async def generate(self, *, token_ids: list[int] | None = None, messages: list[Message] | None = None,
                       tools: Any = None, sampling: SamplingParams) -> Completion:  # fmt: skip
        await asyncio.sleep(self.latency_s)
        return await self.inner.generate(token_ids=token_ids, messages=messages, tools=tools, sampling=sampling)


def play(rule: Any, config: SwarmEnvConfig, helper: Any, n: int) -> list[Trajectory]:
    def factory() -> SwarmEnv:
        return SwarmEnv(config, subagent_policy=helper)

    env = factory()
    tasks = [*env.tasks("train"), *env.tasks("test")][:n]
    rollout = RolloutConfig(max_turns=64, concurrency=1, training=False)
    return asyncio.run(run_episodes(factory, ScriptedPolicy(rule), tasks, rollout))


def mean(trajs: list[Trajectory], key: str) -> float:
    return statistics.fmean(t.metrics[key] for t in trajs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=None, help="wide-search tasks JSONL (default: the cached default set)")
    parser.add_argument("--corpus", default="default", help="search corpus directory of those tasks")
    parser.add_argument("--n", type=int, default=16, help="tasks to play")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="added latency per sub-agent turn")
    args = parser.parse_args()

    config = SwarmEnvConfig(tasks=args.tasks, corpus=args.corpus, orchestrator_max_steps=100, subagent_max_steps=100)
    helper = LatentPolicy(ScriptedPolicy(SearchEnv.scripted_rule, name="search-rule"), args.latency_ms / 1000)
    play(fanout_rule, config, helper, 1)  # warm-up: corpus, embedder, caches
    results = {}
    for label, rule in (("swarm (fan-out)", fanout_rule), ("single agent (serial)", serial_rule)):
        start = time.perf_counter()
        trajs = play(rule, config, helper, args.n)
        errors = [t.error for t in trajs if t.error]
        if errors:
            raise SystemExit(f"{label}: {len(errors)} episodes failed, e.g. {errors[0]}")
        results[label] = {"episodes": len(trajs),
            "critical_steps": mean(trajs, "critical_steps"), "total_steps": mean(trajs, "total_steps"),
            "wall_s": mean(trajs, "swarm/wall_time_s"), "item_f1": mean(trajs, "swarm/item_f1"),
            "rows": statistics.fmean(len(t.children) for t in trajs), "run_s": time.perf_counter() - start,
        }  # fmt: skip
    episodes = results["swarm (fan-out)"]["episodes"]
    print(f"{episodes} wide-search tasks, sub-agent latency {args.latency_ms:g} ms/turn\n")
    print(f"{'':24}{'critical steps':>16}{'total steps':>13}{'wall s/episode':>16}{'item F1':>9}")
    for label, r in results.items():
        print(f"{label:24}{r['critical_steps']:>16.2f}{r['total_steps']:>13.2f}{r['wall_s']:>16.3f}{r['item_f1']:>9.3f}")
    swarm, single = results["swarm (fan-out)"], results["single agent (serial)"]
    crit_ratio = single["critical_steps"] / swarm["critical_steps"]
    print(f"\ncritical steps: {crit_ratio:.2f}x fewer (target >= 4.5x: {'met' if crit_ratio >= 4.5 else 'NOT met'})")
    print(f"wall time: {single['wall_s'] / swarm['wall_s']:.2f}x faster")
    ok = swarm["item_f1"] >= single["item_f1"]
    print(f"item F1: swarm {swarm['item_f1']:.3f} vs single {single['item_f1']:.3f} ({'not worse' if ok else 'WORSE'})")


if __name__ == "__main__":
    main()
