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
