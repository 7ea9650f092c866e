"""SubagentEnv is a Wrapper: the wrapped env's hooks reach it, the sub-agent's own episode carries no reward."""

from typing import Any

from taskrl.env import ToolEnv, Wrapper, acheck_env
from taskrl.envs.swarm.subagents import Subagent, SubagentEnv, SubagentRuntime
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig
from taskrl.scoring import Rubric
from taskrl.tools import tool
from taskrl.types import Task, Trajectory


class Lookup(ToolEnv):
    """An env a sub-agent works in; records the hooks it is called with."""

    name = "lookup"
    system_prompt = "Look things up."
    rubric = Rubric(failure_reward=-1.0)

    def __init__(self) -> None:
        super().__init__()
        self.hooks: list[Any] = []

    @tool
    def find(self, key: str) -> str:
        """Find a value.

        Args:
            key: what to find.
        """
        return key.upper()

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task("t", "Find x.", answer="X")]

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"correct": float(trajectory.final_answer == "X")}

    def observe_context(self, used_tokens: int, max_tokens: int) -> None:
        self.hooks.append("observe_context")

    def record_episode(self, trajectory: Trajectory) -> None:
        self.hooks.append("record_episode")

    def close(self) -> None:
        self.hooks.append("close")


async def test_a_subagent_episode_reaches_the_wrapped_env_hooks_but_not_its_reward() -> None:
    inner = Lookup()
    policy = ScriptedPolicy.from_turns([ScriptedPolicy.call("find", key="x"), "X"])
    runtime = SubagentRuntime(policy, lambda: inner, RolloutConfig(max_turns=4))
    child = await runtime.run(Subagent("a1", "finder", "You find keys."), "Find x.", task_id="t/a1/0", seed=0,
                              max_steps=4)  # fmt: skip
    assert child.error is None and child.final_answer == "X" and child.env == "lookup@subagent"
    assert child.messages[0].content == "You find keys.\n\nLook things up."
    assert child.rewards == {} and child.reward == 0.0 and not child.trainable
    assert inner.training is False  # the sub-agent rollout's training flag reached the wrapped env
    assert inner.hooks == ["observe_context", "observe_context", "record_episode", "close"]


async def test_subagent_env_declares_no_reward_of_its_own() -> None:
    inner = Lookup()
    env = SubagentEnv(inner, Subagent("a1", "finder", "You find keys."))
    assert isinstance(env, Wrapper) and env.unwrapped is inner and env.tools is inner.tools
    assert env.rubric is None and env.failure_reward == 0.0 and env.tasks() == []
    assert not hasattr(env, "set_step") and not hasattr(env, "finalize_group")  # no training clock reaches envs
    await acheck_env(env.unwrapped)
