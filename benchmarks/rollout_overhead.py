"""Framework overhead of the agent loop per env step, against a bare-Python loop (the limit).

Both sides play the same episodes of the built-in ``noop`` env driven by its scripted rule: the rule
writes a Hermes tool call, the call is parsed and dispatched to the no-op tool, the result goes back
into the conversation. The bare loop does exactly that with a regex, ``json.loads`` and a direct call;
taskrl adds validation, concurrency, metrics, trajectories and (in token mode) exact tokenisation.
The bare token-mode baseline tokenises the same observation text once per step, as taskrl must.

    .venv/bin/python benchmarks/rollout_overhead.py [--episodes 64] [--calls 16]

Target (docs/design/index.md, issue 2): overhead <= 100 us per step on the 2-core CI machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time

from taskrl.chat import ChatFormat
from taskrl.envs.builtin import NoopEnv
from taskrl.policies.base import SamplingParams
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.types import Message, Task, ToolCall

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def bare_loop(tasks: list[Task], fmt: ChatFormat | None) -> int:
    """The limit: rule -> regex -> json -> call -> append, nothing else. Returns env steps taken."""
    rule = NoopEnv.scripted_rule
    tools = {"noop": lambda: "ok"}
    steps = 0
    for task in tasks:
        messages = [Message("system", NoopEnv.system_prompt), Message("user", task.prompt)]
        while True:
            text = rule(messages, None)
            calls = [json.loads(m) for m in CALL_RE.findall(text)]
            if not calls:
                break
            parsed = [ToolCall(f"call_{steps}_{i}", c["name"], c["arguments"]) for i, c in enumerate(calls)]
            messages.append(Message("assistant", "", tool_calls=parsed))
            for c in parsed:
                out = tools[c.name](**c.arguments)
                obs = Message("tool", out, tool_call_id=c.id, name=c.name)
                if fmt is not None:
                    fmt.encode(f"<|im_start|>user\n<tool_response>\n{out}\n</tool_response><|im_end|>\n")
                messages.append(obs)
            steps += 1
    return steps


def framework(tasks: list[Task], fmt: ChatFormat | None) -> int:
    config = RolloutConfig(max_turns=10_000, max_context_tokens=1_000_000, concurrency=64,
                           sampling=SamplingParams(max_new_tokens=10_000))  # fmt: skip
    policy = ScriptedPolicy(NoopEnv.scripted_rule, chat_format=fmt)
    trajs = asyncio.run(run_episodes(NoopEnv, policy, tasks, config))
    assert all(t.reward == 1.0 for t in trajs), "benchmark episodes must succeed"
    return int(sum(t.metrics["turns"] - 1 for t in trajs))  # env steps = turns minus the final answer


def measure(fn, tasks, fmt, repeats: int) -> tuple[float, int]:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        steps = fn(tasks, fmt)
        best = min(best, time.perf_counter() - start)
    return best, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--calls", type=int, default=16, help="noop calls per episode")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tasks = [Task(f"noop-{i}", f"Call noop {args.calls} times.", answer="done") for i in range(args.episodes)]

    from taskrl.policies.models import smollm2_tokenizer

    modes = {"message mode": None, "token mode (SmolLM2 tokenizer)": ChatFormat(smollm2_tokenizer())}
    print(f"{args.episodes} episodes x {args.calls} noop steps, best of {args.repeats}")
    header = ("bare us/step", "taskrl us/step", "overhead us", "ratio", "taskrl steps/s")
    print(f"{'mode':34} {header[0]:>13} {header[1]:>15} {header[2]:>12} {header[3]:>6} {header[4]:>15}")
    for name, fmt in modes.items():
        bare_s, bare_steps = measure(bare_loop, tasks, fmt, args.repeats)
        fw_s, fw_steps = measure(framework, tasks, fmt, args.repeats)
        assert bare_steps == fw_steps, (bare_steps, fw_steps)
        bare_us, fw_us = 1e6 * bare_s / bare_steps, 1e6 * fw_s / fw_steps
        overhead, ratio, rate = fw_us - bare_us, fw_us / bare_us, fw_steps / fw_s
        print(f"{name:34} {bare_us:13.1f} {fw_us:15.1f} {overhead:12.1f} {ratio:6.1f} {rate:15.0f}")


if __name__ == "__main__":
    main()
