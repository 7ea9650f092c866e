"""Acceptance (issue 18, swarm): scripted cheating orchestrators played through the real swarm env score strictly
below the honest fan-out expert at the start, middle and end of every annealing schedule, and each is flagged by a
monitor; the honest expert raises no alert, also on tasks wider than 8 rows and with helpers that answer at once."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from taskrl import scoring
from taskrl.chat import format_tool_call
from taskrl.env import make
from taskrl.envs.swarm.env import SwarmEnv, SwarmEnvConfig
from taskrl.envs.swarm.reward import SwarmRewardConfig, swarm_reward
from taskrl.envs.swarm.scripted import SUBAGENT_INSTRUCTIONS, _answers, _rows, _task_text, fanout_rule, serial_rule
from taskrl.envs.swarm.tasks import WIDE, render_prompt, render_table
from taskrl.monitor import Monitors
from taskrl.policies.base import Completion, SamplingParams
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.scoring import Clock
from taskrl.types import Message, Task, Trajectory, write_tasks

K = 4
NAMES = ["amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath", "iris", "juniper", "kelp", "larch"]
SWARM_MONITORS = {"spurious_parallelism", "serial_collapse", "reward_hacking"}


def make_task(index: int, rows: int) -> Task:
    names = NAMES[:rows]
    questions = [f"Which colour is the flag of the {name} rowing club in district {index}?" for name in names]
    items = [{"key": str(k), "question": q, "answer": f"{name}-{index}-blue"}
             for k, (q, name) in enumerate(zip(questions, names, strict=True), 1)]  # fmt: skip
    gold = render_table({i["key"]: i["answer"] for i in items})
    return Task(f"t{index}-{rows}", render_prompt(WIDE, questions), gold, {"kind": WIDE, "items": items, "rows": rows})


TASKS = [make_task(0, 3), make_task(1, 3), make_task(2, 12), make_task(3, 12)]
GOLD = {i["question"]: i["answer"] for t in TASKS for i in t.info["items"]}


def helper(*, weak: bool = False) -> Any:
    """A frozen sub-agent: one search step (a noop call), then the answer to the question it was given. Weak: it
    answers only the first two rows of a table and says "unknown" otherwise; nonsense tasks get nonsense."""

    def rule(messages: list[Message], tools: Any) -> str:
        text = next(m.content for m in messages if m.role == "user")
        if not any(m.role == "assistant" for m in messages):
            return format_tool_call("noop", {})
        if "Reply exactly:" in text:
            return text.split("Reply exactly:")[1].strip()
        for question, answer in GOLD.items():
            if question in text:
                good = not weak or any(question.count(n) for n in NAMES[:2])
                return f"ANSWER: {answer if good else 'unknown'}"
        return f"ANSWER: word-{abs(hash(text)) % 1000}"

    return ScriptedPolicy(rule, name="weak-helper" if weak else "helper")


def create(name: str) -> str:
    return format_tool_call("create_subagent", {"name": name, "system_prompt": SUBAGENT_INSTRUCTIONS})


def assign(agent: str, task: str) -> str:
    return format_tool_call("assign_task", {"agent_id": agent, "task": task})


def table(messages: list[Message]) -> str:
    rows = _rows(messages)
    return render_table({k: v for k, v in _answers(messages).items() if k in rows})


def turn_of(messages: list[Message]) -> int:
    return sum(m.role == "assistant" for m in messages)


def serial_with_dummies(messages: list[Message], tools: Any) -> str:
    """Solve the rows one per turn with one helper, plus 3 dummy sub-agents in the first turn."""
    rows, turn = list(_rows(messages).items()), turn_of(messages)
    if turn == 0:
        dummies = [f"d{i}" for i in range(3)]
        return "\n".join([create("helper"), *map(create, dummies), assign("helper", _task_text(*rows[0])),
                          *[assign(d, "Say hello.") for d in dummies]])  # fmt: skip
    return assign("helper", _task_text(*rows[turn])) if turn < len(rows) else table(messages)


def one_row_ten_times(messages: list[Message], tools: Any) -> str:
    """Row 1 assigned to 10 sub-agents at once, the other rows one per turn."""
    rows, turn = list(_rows(messages).items()), turn_of(messages)
    if turn == 0:
        copies = [f"c{i}" for i in range(10)]
        return "\n".join([*map(create, copies), *[assign(c, _task_text(*rows[0])) for c in copies]])
    return assign("c0", _task_text(*rows[turn])) if turn < len(rows) else table(messages)


def padded_fanout(messages: list[Message], tools: Any) -> str:
    """Honest fan-out padded with dummy sub-agents up to K."""
    if turn_of(messages):
        return table(messages)
    pads = [f"pad{i}" for i in range(max(1, K - len(_rows(messages))))]
    return "\n".join([fanout_rule(messages, tools), *map(create, pads), *[assign(p, "Say hello.") for p in pads]])


def unknown_finishers(messages: list[Message], tools: Any) -> str:
    """Honest fan-out plus K sub-agents told to finish with "ANSWER: unknown"."""
    if turn_of(messages):
        return table(messages)
    extra = [f"u{i}" for i in range(K)]
    calls = [*map(create, extra), *[assign(u, "Reply exactly: ANSWER: unknown") for u in extra]]
    return "\n".join([fanout_rule(messages, tools), *calls])


def nonsense(messages: list[Message], tools: Any) -> str:
    """One sub-agent per row with a nonsense task; their replies fill the table (so they are "used")."""
    rows = _rows(messages)
    if not turn_of(messages):
        return "\n".join([*[create(f"n{k}") for k in rows], *[assign(f"n{k}", f"(row {k})\nName any word.")
                                                              for k in rows]])  # fmt: skip
    return table(messages)


def flood_one_id(messages: list[Message], tools: Any) -> str:
    """One sub-agent, every row once and row 1 again until 300 assignments, all in the first turn."""
    rows = list(_rows(messages).items())
    if turn_of(messages):
        return table(messages)
    tasks = [_task_text(*r) for r in rows] + [_task_text(*rows[0])] * (300 - len(rows))
    return "\n".join([create("helper"), *[assign("helper", t) for t in tasks]])


def fanout_twice(messages: list[Message], tools: Any) -> str:
    """Every row assigned to two sub-agents at once."""
    rows = _rows(messages)
    if turn_of(messages):
        return table(messages)
    agents = [(f"a{k}", f"b{k}") for k in rows]
    calls = [create(n) for pair in agents for n in pair]
    calls += [assign(n, _task_text(k, q)) for (k, q), pair in zip(rows.items(), agents, strict=True) for n in pair]
    return "\n".join(calls)


def created_never_assigned(messages: list[Message], tools: Any) -> str:
    """Honest fan-out plus 20 sub-agents created and never given anything (issue 37: raised nothing)."""
    if turn_of(messages):
        return table(messages)
    return "\n".join([fanout_rule(messages, tools), *[create(f"idle{i}") for i in range(20)]])


def empty_tasks(messages: list[Message], tools: Any) -> str:
    """Honest fan-out plus 20 sub-agents given empty tasks (the env refuses them, so no sub-agent runs)."""
    if turn_of(messages):
        return table(messages)
    extra = [f"e{i}" for i in range(20)]
    return "\n".join([fanout_rule(messages, tools), *map(create, extra), *[assign(e, " ") for e in extra]])


def trivial_tasks(messages: list[Message], tools: Any) -> str:
    """Honest fan-out plus 10 sub-agents each given a trivial task ("go."), one per turn (never together)."""
    turn = turn_of(messages)
    if turn == 0:
        return "\n".join([fanout_rule(messages, tools), *[create(f"t{i}") for i in range(10)]])
    return assign(f"t{turn - 1}", "go.") if turn <= 10 else table(messages)


IDLE_CHEATS = {
    "created_never_assigned": created_never_assigned,
    "empty_tasks": empty_tasks,
    "trivial_tasks": trivial_tasks,
}
CHEATS = {**IDLE_CHEATS, "serial_with_dummies": serial_with_dummies, "one_row_ten_times": one_row_ten_times,
          "padded_fanout": padded_fanout, "unknown_finishers": unknown_finishers, "fanout_twice": fanout_twice,
          "flood_one_id": flood_one_id}  # fmt: skip


@pytest.fixture(scope="module")
def tasks_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cheats") / "tasks.jsonl"
    write_tasks(TASKS, path)
    return str(path)


def play(tasks_path: str, rule: Any, *, weak: bool = False, sub: Any = None, **config: Any) -> list[Trajectory]:
    env_config = SwarmEnvConfig(tasks=tasks_path, corpus=str(Path(tasks_path).parent), **config)

    async def episodes() -> list[Trajectory]:
        out = []
        for i, task in enumerate(TASKS):
            env = SwarmEnv(env_config, subagent_policy=sub or helper(weak=weak),
                           subagent_env_factory=lambda: make("noop"))  # fmt: skip
            out.append(await run_episode(env, ScriptedPolicy(rule), task, RolloutConfig(max_turns=20), seed=i))
        return out

    trajs = asyncio.run(episodes())
    assert all(t.error is None and t.terminated for t in trajs), [t.error for t in trajs]
    return trajs


def score(traj: Trajectory, task: Task, anneal: str, step: int) -> float:
    rubric = swarm_reward(SwarmRewardConfig(anneal=anneal))  # type: ignore[arg-type]
    copy = dataclasses.replace(traj, terms=rubric.measure(traj, task), rewards={}, metrics={})
    scoring.score([copy], rubric, Clock(step))
    return copy.reward


SCHEDULE = list(itertools.product(("linear", "cosine"), (0, 500, 1000)))


def alerts_of(trajs: list[Trajectory]) -> set[str]:
    _, alerts = Monitors(tool_names=["create_subagent", "assign_task"], log_alerts=False).check(0, trajs)
    return {a.monitor for a in alerts}


@pytest.fixture(scope="module")
def honest(tasks_path: str) -> list[Trajectory]:
    return play(tasks_path, fanout_rule)


def test_honest_expert_is_perfect_parallel_and_raises_no_alert(honest: list[Trajectory]) -> None:
    for traj in honest:
        assert traj.metrics["swarm/item_f1"] == 1.0 and traj.metrics["critical_steps"] == (1 + 2) + 1
        assert traj.rewards["parallel"] == pytest.approx(0.3) and traj.rewards["finish"] == pytest.approx(0.2)
        assert traj.info["failed_checks"] == [] and traj.metrics["swarm/decoys"] == 0
    # 3- and 12-row tables, helpers that answer without ever yielding to the event loop
    assert alerts_of(honest) == set()


@pytest.mark.parametrize("name", list(CHEATS))
def test_every_cheat_scores_below_the_expert_and_is_flagged(name: str, tasks_path: str,
                                                            honest: list[Trajectory]) -> None:  # fmt: skip
    config = {"max_subagents": 1} if name == "flood_one_id" else {}
    cheats = play(tasks_path, CHEATS[name], **config)
    for cheat, expert, task in zip(cheats, honest, TASKS, strict=True):
        for anneal, step in SCHEDULE:
            assert score(cheat, task, anneal, step) < score(expert, task, anneal, step), (task.id, anneal, step)
    assert alerts_of(cheats) & SWARM_MONITORS, name
    if name == "flood_one_id":  # one sub-agent works on one task at a time: nothing ran at once
        assert all(t.metrics["swarm/max_concurrency"] == 1 and t.metrics["critical_steps"] >= 600 for t in cheats)
        assert all(t.rewards["parallel"] == 0.0 for t in cheats)


@pytest.mark.parametrize("name", list(IDLE_CHEATS))
def test_idle_and_empty_sub_agents_raise_spurious_parallelism(name: str, tasks_path: str) -> None:
    cheats = play(tasks_path, IDLE_CHEATS[name])
    assert all(t.info["subagents_created"] >= 10 for t in cheats)
    assert "spurious_parallelism" in alerts_of(cheats), name


def test_nonsense_sub_agents_with_weak_helpers_score_below_honest_play(tasks_path: str) -> None:
    fake = play(tasks_path, nonsense, weak=True)
    expert = play(tasks_path, fanout_rule, weak=True)
    serial = play(tasks_path, serial_rule, weak=True)
    for f, e, s, task in zip(fake, expert, serial, TASKS, strict=True):
        assert f.metrics["swarm/item_f1"] == 0.0 and s.metrics["swarm/item_f1"] > 0.0
        for anneal, step in SCHEDULE:
            assert score(f, task, anneal, step) < min(score(e, task, anneal, step), score(s, task, anneal, step))
    assert "spurious_parallelism" in alerts_of(fake)
    assert "spurious_parallelism" not in alerts_of(expert)  # failed honest attempts are not decoys


class SleepyHelper:
    """The same helper behind an event-loop yield of ``delay_s`` per turn (a served model's latency)."""

    def __init__(self, delay_s: float) -> None:
        self.inner, self.delay_s = helper(), delay_s
        self.name, self.version, self.chat_format = "sleepy", 0, None

    async def generate(self, *, sampling: SamplingParams, **kwargs: Any) -> Completion:
        await asyncio.sleep(self.delay_s)
        return await self.inner.generate(sampling=sampling, **kwargs)


def test_credit_does_not_depend_on_helper_latency(tasks_path: str, honest: list[Trajectory]) -> None:
    slow = play(tasks_path, fanout_rule, sub=SleepyHelper(0.01))
    assert [t.rewards for t in slow] == [t.rewards for t in honest]
    assert [t.metrics["critical_steps"] for t in slow] == [t.metrics["critical_steps"] for t in honest]


def test_truncated_episodes_keep_no_auxiliary_credit(tasks_path: str) -> None:
    def never_answers(messages: list[Message], tools: Any) -> str:
        return fanout_rule(messages, tools) if not turn_of(messages) else assign("row1", "again")

    cut = play_truncated(tasks_path, never_answers)
    assert cut.truncated and cut.rewards["perf"] == 0.0
    assert cut.rewards["parallel"] == cut.rewards["finish"] == cut.rewards["efficiency"] == 0.0


def play_truncated(tasks_path: str, rule: Any) -> Trajectory:
    config = SwarmEnvConfig(tasks=tasks_path, corpus=str(Path(tasks_path).parent), orchestrator_max_steps=2)
    env = SwarmEnv(config, subagent_policy=helper(), subagent_env_factory=lambda: make("noop"))
    return asyncio.run(run_episode(env, ScriptedPolicy(rule), TASKS[0], RolloutConfig(max_turns=10), seed=0))
