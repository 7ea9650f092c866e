"""Cost of watching a run: ``Monitors.check`` per batch and ``taskrl report`` per trajectory, against the rollout.

A batch of real ``shop`` episodes is played by the env's expert rule in token mode (the cheapest possible
rollout: no model), then the monitors judge it and the report renders it. The baseline is playing the batch
itself, measured in the same run: with a real model each episode costs seconds, so this ratio is an upper bound.

    .venv/bin/python benchmarks/monitor_overhead.py [--episodes 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from taskrl.chat import ChatFormat
from taskrl.env import make
from taskrl.monitor import Monitors
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.report import build_report
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.runlog import RunLog


def best_of(repeats: int, fn) -> float:  # noqa: ANN001 - any zero-argument callable
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = make("shop", num_tasks=args.episodes // 2)
    policy = ScriptedPolicy(env.scripted_rule, chat_format=ChatFormat(smollm2_tokenizer()))
    config = RolloutConfig(group_size=2, concurrency=32)
    tasks = list(env.tasks())

    def play() -> list:
        return asyncio.run(run_episodes(lambda: make("shop"), policy, tasks, config))

    batch = play()
    rollout_s = best_of(args.repeats, play)
    monitors = Monitors(tool_names=env.tools.names)
    monitor_s = best_of(args.repeats, lambda: monitors.check(0, batch))
    with tempfile.TemporaryDirectory() as tmp:
        log = RunLog(tmp)
        for step in range(4):
            log.log(step, monitors.check(step, batch)[0])
            log.write_trajectories(step, batch)
        report_s = best_of(args.repeats, lambda: build_report(tmp, Path(tmp) / "r.html", max_trajectories=10_000))
        size_mb = (Path(tmp) / "r.html").stat().st_size / 1e6
    n = len(batch)
    print(f"{n} episodes of shop (expert rule, token mode), best of {args.repeats}")
    print(f"{'rollout (baseline)':<28}{rollout_s * 1e3:9.1f} ms  {rollout_s / n * 1e6:8.0f} us/episode")
    print(f"{'Monitors.check':<28}{monitor_s * 1e3:9.1f} ms  {monitor_s / n * 1e6:8.0f} us/episode  "
          f"{monitor_s / rollout_s:6.1%} of the rollout")  # fmt: skip
    print(f"{'build_report (4 steps)':<28}{report_s * 1e3:9.1f} ms  {report_s / (4 * n) * 1e6:8.0f} us/episode  "
          f"{size_mb:.1f} MB HTML")  # fmt: skip


if __name__ == "__main__":
    main()
