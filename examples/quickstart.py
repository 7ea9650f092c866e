"""Define a tool, an env and a reward, then play episodes with SmolLM2 (the README's example).

    .venv/bin/python examples/quickstart.py
"""

import asyncio

from taskrl.env import ToolEnv, make, register
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.tools import tool
from taskrl.types import Task


class WeatherEnv(ToolEnv):
    system_prompt = "Answer with the temperature in Celsius. Use the tools."

    def tasks(self, split="train"):
        return [Task("paris", "How warm is it in Paris right now?", answer=18)]

    @tool
    def get_temperature(self, city: str) -> str:
        """Current temperature of a city, in Celsius.

        Args:
            city: the city's name, e.g. "Paris".
        """
        return {"paris": "18"}.get(city.lower(), f"no data for {city}")

    def reward(self, trajectory):
        return {"correct": float("18" in (trajectory.final_answer or ""))}


def main() -> None:
    from taskrl.policies.hf import HFPolicy

    register("weather", WeatherEnv, overwrite=True)
    policy = HFPolicy.from_pretrained("smollm2")  # or OpenAIPolicy("http://host:8000/v1", "model")
    config = RolloutConfig(group_size=4, max_turns=4)  # K=4 samples per task, for GRPO
    trajectories = asyncio.run(run_episodes(lambda: make("weather"), policy, make("weather").tasks(), config))
    print([(t.reward, t.metrics["tool_calls"]) for t in trajectories])


if __name__ == "__main__":
    main()
