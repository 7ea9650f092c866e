"""The README's example env satisfies the contract and can be solved through the agent loop."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from taskrl.env import acheck_env
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def load_example():
    spec = importlib.util.spec_from_file_location("quickstart", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_quickstart_env_checks_and_rewards_a_correct_episode() -> None:
    env_cls = load_example().WeatherEnv
    await acheck_env(env_cls())
    policy = ScriptedPolicy.from_turns([ScriptedPolicy.call("get_temperature", city="Paris"), "It is 18 C."])
    trajs = await run_episodes(env_cls, policy, env_cls().tasks(), RolloutConfig(group_size=2))
    assert [t.reward for t in trajs] == [1.0, 1.0]
    assert trajs[0].messages[3].content == "18"


async def test_quickstart_reward_is_not_payable_without_the_tool_and_the_expert_solves_it() -> None:
    """Issue 38: the README's reward paid '18' typed without calling the tool; its scripted_rule is the expert."""
    env_cls = load_example().WeatherEnv
    guess = await run_episodes(env_cls, ScriptedPolicy.from_turns(["It is 18 C."]), env_cls().tasks(), RolloutConfig())
    assert [t.reward for t in guess] == [0.0] and guess[0].terms == {"correct": 1.0, "used_tool": 0.0}
    expert = await run_episodes(env_cls, ScriptedPolicy(env_cls.scripted_rule), env_cls().tasks(), RolloutConfig())
    assert [t.reward for t in expert] == [1.0]


def test_the_readme_shows_the_example_env_as_it_is_tested() -> None:
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    source = EXAMPLE.read_text()
    start, end = source.index("class WeatherEnv"), source.index("\n\n\ndef main")
    assert source[start:end] in readme
