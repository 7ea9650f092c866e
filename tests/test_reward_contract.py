"""What ``reward()`` may return, and what happens when it does not (issue 38 item 5): one float is a term named
``reward``; a wrong shape or an exception is the episode's error naming the env and ``reward()``, counted, and
printed by the CLI instead of a silent reward 0."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from taskrl.env import EnvCheckError, ToolEnv, acheck_env
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.scoring import batch_metrics
from taskrl.tools import tool
from taskrl.types import Task, Trajectory


class AnswerEnv(ToolEnv):
    name = "answer"
    returns: object = 1.0

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task("t0", "Say 4.", answer=4), Task("t1", "Say 4 again.", answer=4)]

    @tool
    def noop(self) -> str:
        """Do nothing."""
        return "ok"

    def reward(self, trajectory: Trajectory) -> object:
        if self.returns == "raise":
            raise ZeroDivisionError("division by zero")
        if self.returns == "float":
            return float(trajectory.final_answer == "4")
        return self.returns


def play(returns: object) -> list[Trajectory]:
    env_cls = type("Env", (AnswerEnv,), {"returns": returns})
    policy = ScriptedPolicy.from_turns(["4"])
    return asyncio.run(run_episodes(env_cls, policy, env_cls().tasks(), RolloutConfig()))


def test_one_float_is_the_reward_term() -> None:
    trajectories = play("float")
    assert [t.reward for t in trajectories] == [1.0, 1.0] and trajectories[0].terms == {"reward": 1.0}
    assert all(t.error is None for t in trajectories)
    asyncio.run(acheck_env(type("Env", (AnswerEnv,), {"returns": "float"})()))  # check_env accepts it too


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        ("raise", "env 'answer': reward() raised ZeroDivisionError: division by zero"),
        ("yes", "env 'answer': reward() must return a dict of term name -> float (or None)"),
        ({"correct": "yes"}, "reward() must return a dict of term name -> float (or None), e.g. {'correct': 1.0}"),
        ({"correct": float("nan")}, "got 'correct': 'nan'"),
    ],
)
def test_a_broken_reward_is_a_counted_error_naming_reward(returns: object, message: str) -> None:
    trajectories = play(returns)
    assert all(t.error is not None and message in t.error and t.reward == 0.0 for t in trajectories), [
        t.error for t in trajectories
    ]
    assert batch_metrics(trajectories)["charts/errors"] == 2
    with pytest.raises(EnvCheckError, match="reward()"):
        asyncio.run(acheck_env(type("Env", (AnswerEnv,), {"returns": returns})()))


def test_rollout_prints_how_many_episodes_failed_and_why(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from taskrl.cli import app

    module = tmp_path / "broken_env.py"
    module.write_text(textwrap.dedent('''
        from taskrl.chat import format_tool_call
        from taskrl.env import ToolEnv
        from taskrl.tools import tool
        from taskrl.types import Task

        class BrokenEnv(ToolEnv):
            scripted_rule = staticmethod(lambda messages, tools: "4")

            def tasks(self, split="train"):
                return [Task("t0", "Say 4.", answer=4)]

            @tool
            def noop(self) -> str:
                """Do nothing."""
                return "ok"

            def reward(self, trajectory):
                return sum(1.0)  # the bug the issue saw: TypeError: 'float' object is not iterable
    '''))
    run = CliRunner().invoke(app, ["rollout", "--env", f"{module}:BrokenEnv", "--policy", "scripted", "--n", "1",
                                   "--out", str(tmp_path / "r.jsonl")])  # fmt: skip
    assert run.exit_code == 0, run.output
    text = " ".join(run.output.split())
    assert "1 of 1 episodes ended in an error (reward 0)" in text
    assert "reward() raised TypeError: 'float' object is not iterable" in text
