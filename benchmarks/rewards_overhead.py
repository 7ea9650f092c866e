"""Cost of the reward toolkit: scoring one trajectory with each preset, and LoopGuard's cost per env step.

Scoring: a 32-turn trajectory (two calls per turn) measured by each preset's ``Rubric`` and scored by
``taskrl.scoring.score`` against a
hand-written function computing the same Composer terms inline (the limit: no composition, no validation,
no raw-metric recording). LoopGuard: the ``noop`` env played through the agent loop with and without the guard.

    .venv/bin/python benchmarks/rewards_overhead.py [--repeats 2000]

Target: scoring stays far below one agent-loop step (25 us/step message mode, benchmarks/RESULTS.md) per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Callable

from taskrl.envs.builtin import NoopEnv
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.loops import LoopGuard
from taskrl.rewards.presets import PRESETS
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.scoring import Clock, Rubric, score
from taskrl.types import Message, Task, ToolCall, Trajectory


def score_one(rubric: Rubric, traj: Trajectory, task: Task) -> float:
    """Measure and score one trajectory, as an env and the trainer do."""
    traj.terms = rubric.measure(traj, task)
    score([traj], rubric, Clock())
    return traj.reward


def long_trajectory(turns: int = 32) -> Trajectory:
    messages = [Message("system", "s"), Message("user", "2 x apple and 3 x pear")]
    for t in range(turns):
        calls = [ToolCall(f"call_{2 * t}", "lookup_price", {"item": f"item{t}"}),
                 ToolCall(f"call_{2 * t + 1}", "calculator", {"expression": f"{t}*3"})]  # fmt: skip
        messages.append(Message("assistant", "", tool_calls=calls))
        messages += [Message("tool", f"item{t}: ${t}", tool_call_id=calls[0].id, name="lookup_price"),
                     Message("tool", str(3 * t), tool_call_id=calls[1].id, name="calculator")]  # fmt: skip
    messages.append(Message("assistant", "The total is 18."))
    info = {"final_answer": "The total is 18.", "tests_passed": 3, "tests_total": 4, "test_coverage": 0.5,
            "output_chunks": ["c1", "c2"], "seen_chunks": ["c1", "c2", "c3"]}  # fmt: skip
    return Trajectory(task_id="t", messages=messages, info=info, terminated=True)


def inline_composer(traj: Trajectory) -> dict[str, float]:
    """The Composer preset's terms, written inline (the baseline)."""
    results = {m.tool_call_id: m.content for m in traj.messages if m.role == "tool"}
    calls = [c for m in traj.messages if m.role == "assistant" for c in m.tool_calls]
    invalid = sum(results.get(c.id, "").startswith(("Invalid tool call:", "Unknown tool '")) for c in calls)
    x = float(len(calls))
    shortfall = max(0.0, 0.8 - traj.info["test_coverage"]) / 0.8
    return {
        "tests": traj.info["tests_passed"] / traj.info["tests_total"],
        "valid_tool_use": 0.1 * (1 - invalid / len(calls)),
        "effort": -0.1 * x / (1 + x),
        "trivial_tests": -0.5 * math.expm1(3 * shortfall) / math.expm1(3),
    }


def per_call_us(fn: Callable[[], object], repeats: int) -> float:
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1e6


def loop_us_per_step(guarded: bool, episodes: int) -> float:
    """One timed run of ``episodes`` noop episodes (16 steps each); microseconds per env step."""
    tasks = [Task(f"noop-{i}", "Call noop 16 times.", answer="done") for i in range(episodes)]
    factory = (lambda: LoopGuard(NoopEnv(), "penalize")) if guarded else NoopEnv
    config = RolloutConfig(max_turns=64, concurrency=64)
    start = time.perf_counter()
    trajs = asyncio.run(run_episodes(factory, ScriptedPolicy(NoopEnv.scripted_rule), tasks, config))
    steps = sum(t.metrics["turns"] - 1 for t in trajs)
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--episodes", type=int, default=64)
    args = parser.parse_args()
    traj = long_trajectory()
    task = Task("t", "q", answer="18", info={"relevant_chunks": ["c1", "c3"], "answer_chunk_ids": ["c3"]})
    baseline = per_call_us(lambda: inline_composer(traj), args.repeats)
    print(f"scoring a 32-turn, 64-call trajectory (best of 3 x {args.repeats}):")
    print(f"| reward | us/trajectory | vs inline Composer function ({baseline:.1f} us) |")
    print("|---|---:|---:|")
    for name, build in PRESETS.items():
        reward = build()
        us = per_call_us(lambda reward=reward: score_one(reward, traj, task), args.repeats)
        print(f"| {name} | {us:.1f} | {us / baseline:.1f}x |")
    # Alternate the two so load on the shared machine hits both alike; keep the best of each.
    runs = [(loop_us_per_step(False, args.episodes), loop_us_per_step(True, args.episodes)) for _ in range(7)]
    bare, guarded = min(r[0] for r in runs), min(r[1] for r in runs)
    print(f"\nagent loop, noop env, {args.episodes} episodes x 16 steps (best of 7, alternated):")
    print(f"| env | us/step |\n|---|---:|\n| NoopEnv | {bare:.1f} |\n| LoopGuard(NoopEnv) | {guarded:.1f} |")
    print(f"LoopGuard overhead: {guarded - bare:.1f} us/step ({guarded / bare:.2f}x)")


if __name__ == "__main__":
    main()
