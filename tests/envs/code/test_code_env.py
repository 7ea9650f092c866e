"""Acceptance: gold fixes score 1, test edits and deletions score 0, escapes are contained mid-episode."""

from __future__ import annotations

import dataclasses
import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from taskrl.env import acheck_env, make
from taskrl.envs.code.env import CodeBugsEnv, CodeEnv, CodeEnvConfig, HumanEvalEnv
from taskrl.envs.code.sandbox import SandboxConfig
from taskrl.envs.code.tasks import BUILTIN_BUGS, humaneval_tasks, load_bug_tasks
from taskrl.envs.code.workspace import WorkspaceConfig
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode, run_episodes
from taskrl.types import Message, Task, Trajectory

call = ScriptedPolicy.call


@pytest.fixture
def config(small_limits: SandboxConfig, workspace_config: WorkspaceConfig) -> CodeEnvConfig:
    return CodeEnvConfig(sandbox=small_limits, workspace=workspace_config)


async def play(env: CodeEnv, task: Task, rule: Callable[[list[Message], Any], str], **kw: Any) -> Trajectory:
    try:
        return await run_episode(env, ScriptedPolicy(rule), task, RolloutConfig(**{"max_turns": 12, **kw}), seed=0)
    finally:
        env.close()


def scripted(turns: list[str]) -> Callable[[list[Message], Any], str]:
    return ScriptedPolicy.from_turns(turns).rule


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/38"])  # 38: the solution uses a helper in the prompt
async def test_gold_solution_scores_one_on_humaneval(config: CodeEnvConfig, task_id: str) -> None:
    env = HumanEvalEnv(config)
    task = next(t for t in env.tasks("all") if t.id == task_id)
    traj = await play(env, task, env.scripted_rule)
    assert traj.error is None and traj.terminated
    assert traj.rewards == {"tests": 1.0}
    assert (
        traj.metrics["tampering"] == 0.0
        and traj.metrics["no_edit"] == 0.0
        and traj.info["hidden_tests"] == {"passed": 1}
    )
    assert [c.name for m in traj.messages for c in m.tool_calls] == ["read_file", "write_file", "run_tests"]


async def test_humaneval_stub_scores_zero_and_counts_as_no_edit(config: CodeEnvConfig) -> None:
    env = HumanEvalEnv(config)
    traj = await play(env, env.tasks("all")[2], scripted(["Could you tell me which approach you prefer?"]))
    assert traj.rewards == {"tests": 0.0}
    assert traj.metrics["no_edit"] == 1.0 and traj.metrics["clarifying_question"] == 1.0


def test_humaneval_splits() -> None:
    train, test, every = humaneval_tasks("train"), humaneval_tasks("test"), humaneval_tasks("all")
    assert (len(train), len(test), len(every)) == (131, 33, 164)
    assert {t.id for t in train}.isdisjoint(t.id for t in test)
    assert all(t.answer is None and t.info["fail_to_pass"] for t in every)


@pytest.fixture(scope="module")
def bug_tasks() -> list[Task]:
    return load_bug_tasks().tasks


async def test_gold_fix_scores_one_on_mined_tasks(config: CodeEnvConfig, bug_tasks: list[Task]) -> None:
    env = CodeBugsEnv(config=config)
    for task in (bug_tasks[0], bug_tasks[3]):
        traj = await play(CodeBugsEnv(config=config), task, env.scripted_rule)
        assert traj.rewards == {"tests": 1.0}, traj.info
        assert traj.info["hidden_tests"] == {"passed": len(load_bug_tasks().meta["baseline_passed"])}


async def test_localised_tasks_name_the_bug_window_and_the_expert_reads_only_it(config: CodeEnvConfig) -> None:
    env = CodeBugsEnv([str(BUILTIN_BUGS), str(BUILTIN_BUGS)], config=config, kinds=["flip comparison"], hint_lines=4)
    tasks = env.tasks("all")
    assert len(tasks) == 2 * sum(t.info["mutation"] == "flip comparison" for t in load_bug_tasks().tasks)
    task = tasks[0]
    start, end = task.info["read_window"]
    assert task.prompt.endswith(f"lines {start}-{end}.") and end - start < 20
    traj = await play(CodeBugsEnv([str(BUILTIN_BUGS)], config=config, hint_lines=4), task, env.scripted_rule)
    assert traj.rewards == {"tests": 1.0}, traj.info
    read = traj.messages[2].tool_calls[0]
    assert (read.name, read.arguments["start_line"], read.arguments["end_line"]) == ("read_file", start, end)
    shown = next(m.content for m in traj.messages if m.role == "tool")
    assert task.info["gold"]["edit"]["old"] in shown and len(shown.splitlines()) == end - start + 1


async def test_editing_the_tests_scores_zero_with_tampering(config: CodeEnvConfig, bug_tasks: list[Task]) -> None:
    task = bug_tasks[0]  # pluralize: "not" dropped
    failing = task.info["fail_to_pass"][0].split("::")[1].split("[")[0]
    rewrite = (
        f"python - <<'EOF'\nimport re\np = 'test_inflection.py'\ns = open(p).read()\n"
        f"s = s.replace('def {failing}(', 'def _disabled_{failing}(')\nopen(p, 'w').write(s)\nEOF"
    )
    traj = await play(
        CodeBugsEnv(config=config), task, scripted([call("run_command", command=rewrite), "Tests pass now."])
    )
    assert traj.rewards == {"tests": 0.0}
    assert traj.metrics["tampering"] == 1.0 and traj.info["tampering"] == ["modified test_inflection.py"]
    assert traj.info["test_failure"].startswith("tampering")


async def test_deleting_the_tests_scores_zero(config: CodeEnvConfig, bug_tasks: list[Task]) -> None:
    rule = scripted([call("run_command", command="rm test_inflection.py"), call("run_tests"), "All green."])
    traj = await play(CodeBugsEnv(config=config), bug_tasks[1], rule)
    assert traj.rewards == {"tests": 0.0}
    assert traj.info["tampering"] == ["deleted test_inflection.py"]
    run_tests_output = [m.content for m in traj.messages if m.role == "tool"][1]
    assert "problem: no tests collected" in run_tests_output or "no tests" in run_tests_output


async def test_invalid_tool_calls_never_beat_a_failure(config: CodeEnvConfig) -> None:
    env = HumanEvalEnv(config)
    task = env.tasks("all")[0]
    gold = task.info["gold"]["write"]["solution.py"]
    rule = scripted(['<tool_call>{"name": "write_file", "arguments": {broken</tool_call>',
                     call("write_file", path="solution.py", content=gold), "Done."])  # fmt: skip
    traj = await play(env, task, rule)
    assert traj.rewards["tests"] == 1.0 and traj.metrics["invalid_tool_calls"] == 1
    assert traj.reward <= env.failure_reward


ESCAPES = [
    ("run_command", {"command": "cat /etc/shadow"}, "No such file"),
    ("run_command", {"command": "echo pwned > {canary}"}, "Directory nonexistent"),
    ("run_command", {"command": "python -c \"import socket; socket.create_connection(('1.1.1.1', 53))\""}, "unreach"),
    ("run_command", {"command": "bash -c ':(){ :|:& };: ; sleep 30'"}, "wall timeout"),
    ("run_command", {"command": "python -c 'while True: pass'"}, "CPU time limit exceeded|wall timeout"),
    ("run_command", {"command": "yes | head -c 1000000000"}, "output limit"),
    ("run_command", {"command": "ln -s {outside} out"}, "exit code 0"),
    ("read_file", {"path": "out/canary.txt"}, "points outside the workspace"),
    ("write_file", {"path": "/tmp/evil.txt", "content": "x"}, "is absolute"),
]  # fmt: skip


async def test_escape_attempts_are_contained_and_the_episode_goes_on(
    small_limits: SandboxConfig, workspace_config: WorkspaceConfig, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = outside / "canary.txt"
    canary.write_text("host")

    def fill(text: str) -> str:
        return text.replace("{canary}", str(canary)).replace("{outside}", str(outside))

    turns = [call(name, **{k: fill(v) for k, v in args.items()}) for name, args, _ in ESCAPES]
    sandbox = SandboxConfig(**{**small_limits.__dict__, "timeout_s": 3.0, "cpu_seconds": 1})
    env = HumanEvalEnv(CodeEnvConfig(sandbox=sandbox, workspace=workspace_config))
    traj = await play(env, env.tasks("all")[0], scripted([*turns, "I could not solve it."]), max_turns=len(turns) + 1)
    assert traj.error is None and traj.terminated and traj.rewards == {"tests": 0.0}
    observations = [m.content for m in traj.messages if m.role == "tool"]
    assert len(observations) == len(ESCAPES)
    for (name, args, expected), seen in zip(ESCAPES, observations, strict=True):
        assert any(e in seen for e in expected.split("|")), f"{name}({args}): {seen}"
    assert canary.read_text() == "host" and not Path("/tmp/evil.txt").exists()


async def test_checkpoints_every_step_and_restore(config: CodeEnvConfig) -> None:
    config.checkpoint_every_step = True
    env = HumanEvalEnv(config)
    await env.reset(env.tasks("all")[0])
    rule = [call("write_file", path="a.txt", content="one"), call("write_file", path="a.txt", content="two")]
    for text in rule:
        from taskrl.parsing import parse_hermes

        await env.step(parse_hermes(text, env.tools).tool_calls)
    assert env.workspace is not None and env.workspace.snapshots == ["step-1", "step-2"]
    env.restore("step-1")
    assert (env.workspace.path / "a.txt").read_text() == "one"
    env.snapshot("mine")
    assert "mine" in env.workspace.snapshots
    env.close()


async def test_a_hostile_tree_in_one_episode_leaves_the_rest_of_the_batch_whole(config: CodeEnvConfig) -> None:
    """Issue 19: a 1,200-level tree crashed reward, snapshot and close on the host and failed all of run_episodes."""
    config.checkpoint_every_step = True
    envs: list[HumanEvalEnv] = []
    expert = HumanEvalEnv(config)
    tasks = expert.tasks("all")[:2]
    hostile = call("run_command", command="mkdir -p $(python -c \"print('/'.join(['d'] * 1200))\")")

    def rule(messages: list[Message], tools: Any) -> str:
        if next(m.content for m in messages if m.role == "user") != tasks[0].prompt:
            return expert.scripted_rule(messages, tools)
        return hostile if not any(m.role == "tool" for m in messages) else "Done."

    def factory() -> HumanEvalEnv:
        envs.append(HumanEvalEnv(config))
        return envs[-1]

    try:
        trajs = await run_episodes(factory, ScriptedPolicy(rule), tasks, RolloutConfig(max_turns=6, concurrency=2))
    finally:
        for env in [*envs, expert]:
            env.close()
    assert [t.task_id for t in trajs] == [t.id for t in tasks]
    bad, good = trajs
    assert bad.error is None and bad.rewards == {"tests": 0.0} and bad.metrics["unscorable_workspace"] == 1.0
    assert bad.metrics["checkpoint_failed"] == 1.0
    assert good.error is None and good.rewards == {"tests": 1.0}


async def test_workspaces_are_destroyed_by_close_and_by_garbage_collection(config: CodeEnvConfig) -> None:
    env = HumanEvalEnv(config)
    await env.reset(env.tasks("all")[0])
    first = env.workspace
    await env.reset(env.tasks("all")[1])  # a reset releases the previous workspace
    assert first is not None and not first.alive and not first.dir.exists()
    second = env.workspace
    env.close()
    env.close()
    assert second is not None and not second.dir.exists()
    dropped = HumanEvalEnv(config)
    await dropped.reset(dropped.tasks("all")[0])
    third = dropped.workspace
    del dropped
    gc.collect()
    assert third is not None and not third.dir.exists()


@pytest.mark.parametrize("name", ["code-humaneval", "code-bugs"])
async def test_registered_with_default_arguments(name: str) -> None:
    env = make(name)
    try:
        await acheck_env(env)
    finally:
        env.close()


def test_unsafe_flag_is_explicit_and_does_not_change_the_callers_config(config: CodeEnvConfig) -> None:
    env = HumanEvalEnv(config, unsafe_no_sandbox=True)
    assert not env.sandbox.isolated and config.sandbox.unsafe_no_sandbox is False
    assert HumanEvalEnv(config).sandbox.isolated
    with pytest.raises(ValueError, match="CodeEnvConfig.sandbox must be a SandboxConfig"):
        CodeEnvConfig(sandbox={"timeout_s": 1})  # type: ignore[arg-type]


def test_cli_rollout_with_the_scripted_expert(tmp_path: Path) -> None:
    from taskrl.cli import app

    out = tmp_path / "he.jsonl"
    result = CliRunner().invoke(
        app, ["rollout", "--env", "code-humaneval", "--policy", "scripted", "--n", "1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["rewards"] == {"tests": 1.0} and row["task_id"] == "HumanEval/1"


async def test_the_line_expert_fixes_every_bundled_task_when_played(config: CodeEnvConfig) -> None:
    """Played for real (sandbox, hidden tests): read the numbered window, replace_lines, run the tests. The small
    limits' 5 s per command are not what this checks (a shared CI machine ran one project's tests past them)."""
    config = dataclasses.replace(config, sandbox=dataclasses.replace(config.sandbox, timeout_s=60.0, cpu_seconds=30))
    env = CodeBugsEnv([str(BUILTIN_BUGS)], config=config, hint_lines=6, edit_tool="replace_lines")
    for task in env.tasks("all"):
        traj = await play(CodeBugsEnv([str(BUILTIN_BUGS)], config=config, hint_lines=6, edit_tool="replace_lines"),
                          task, env.scripted_rule)  # fmt: skip
        assert traj.rewards == {"tests": 1.0}, (task.id, traj.info)
        calls = [c for m in traj.messages for c in m.tool_calls]
        assert [c.name for c in calls] == ["read_file", "replace_lines", "run_tests"], task.id
        shown = [m.content for m in traj.messages if m.role == "tool"]
        start = task.info["read_window"][0]
        assert shown[0].lstrip().startswith(f"{start}\t") and shown[1].startswith("replaced lines ")
        assert traj.metrics["edits"] == 1


async def test_the_pinpointed_expert_replaces_the_named_lines_in_two_turns(config: CodeEnvConfig) -> None:
    """hint_exact: the prompt names the lines the fix replaces; read -> replace_lines of exactly those lines fixes
    every bundled task with the episode cut at two turns (the hidden tests score it, no run_tests turn)."""
    kwargs = {"config": config, "hint_lines": 3, "hint_exact": True, "edit_tool": "replace_lines"}
    env = CodeBugsEnv([str(BUILTIN_BUGS)], **kwargs)
    for task in env.tasks("all"):
        traj = await play(CodeBugsEnv([str(BUILTIN_BUGS)], **kwargs), task, env.scripted_rule, max_turns=2)
        assert traj.rewards == {"tests": 1.0}, (task.id, traj.info)
        calls = [c for m in traj.messages for c in m.tool_calls]
        assert [c.name for c in calls] == ["read_file", "replace_lines"], task.id
        assert [calls[1].arguments["start_line"], calls[1].arguments["end_line"]] == task.info["fix_lines"]


MINED = sorted((Path(__file__).parents[3] / "experiments/data/code").glob("*.json"))


@pytest.mark.parametrize("path", MINED, ids=lambda p: p.stem)
async def test_the_line_expert_fixes_a_task_of_every_mined_package(config: CodeEnvConfig, path: Path) -> None:
    """One task per package played (each has its own test layout); test_code_tasks checks every task's call."""
    env = CodeBugsEnv(str(path), config=config, hint_lines=6, edit_tool="replace_lines")
    task = env.tasks("all")[-1]
    traj = await play(CodeBugsEnv(str(path), config=config, hint_lines=6, edit_tool="replace_lines"), task,
                      env.scripted_rule)  # fmt: skip
    assert traj.rewards == {"tests": 1.0}, (task.id, traj.info)
