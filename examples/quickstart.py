"""Define a tool, an env and a reward, then play episodes with SmolLM2 (the README's example).

    .venv/bin/python examples/quickstart.py
"""

import asyncio

from taskrl.chat import format_tool_call
from taskrl.env import ToolEnv, make, register
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.scoring import GateRule, Rubric
from taskrl.tools import tool
from taskrl.types import Task


class WeatherEnv(ToolEnv):
    system_prompt = "Answer with the temperature in Celsius. Use the tools."
    rubric = Rubric(gates=[GateRule("used_tool")])  # an answer without the tool call scores as a failure

    def tasks(self, split="train"):
        return [Task("paris", "How warm is it in Paris right now?", answer=18)]

    @tool
    def get_temperature(self, city: str) -> str:
        """Current temperature of a city, in Celsius.

        Args:
            city: the city's name, e.g. "Paris".
        """
        return {"paris": "18"}.get(city.lower(), f"no data for {city}")

    def reward(self, trajectory):  # unweighted terms (or one float); self.task is the task being played
        used = any(c.name == "get_temperature" for m in trajectory.messages for c in m.tool_calls)
        return {"correct": float(str(self.task.answer) in (trajectory.final_answer or "")), "used_tool": float(used)}

    @staticmethod
    def scripted_rule(messages, tools):  # optional expert: `--policy scripted`, SFT warm-up; sees the conversation
        if messages[-1].role == "tool":
            return messages[-1].content
        return format_tool_call("get_temperature", {"city": "Paris"})


def main() -> None:
    from taskrl.policies.hf import HFPolicy

    register("weather", WeatherEnv, description="temperature lookup (1 tool)", overwrite=True)
    policy = HFPolicy.from_pretrained("smollm2")  # or OpenAIPolicy("http://host:8000/v1", "model")
    config = RolloutConfig(group_size=4, max_turns=4)  # K=4 samples per task, for GRPO
    trajectories = asyncio.run(run_episodes(lambda: make("weather"), policy, make("weather").tasks(), config))
    print([(t.reward, t.metrics["tool_calls"]) for t in trajectories])


if __name__ == "__main__":
    main()
