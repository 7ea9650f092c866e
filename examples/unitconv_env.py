"""The README's "Your own env, end to end": a unit-conversion env with one tool, used from the CLI as
``--env unitconv_env:UnitConvEnv`` (run from this file's directory) -- check, roll out, train, eval, serve."""

from taskrl.chat import format_tool_call
from taskrl.env import ToolEnv
from taskrl.scoring import GateRule, Rubric
from taskrl.tools import tool
from taskrl.types import Task

FACTORS = {("km", "m"): 1000, ("kg", "g"): 1000, ("h", "min"): 60, ("m", "cm"): 100}


class UnitConvEnv(ToolEnv):
    system_prompt = "Convert units with the convert tool, then reply with the number only."
    rubric = Rubric(gates=[GateRule("used_convert")])  # no pay without calling the tool: used_convert < 1 fails

    def tasks(self, split="train"):  # held-out values in "test"
        values = range(1, 9) if split == "train" else range(11, 15)
        return [Task(f"{v}{a}-{b}", f"How many {b} is {v} {a}?", answer=v * factor)
                for v in values for (a, b), factor in FACTORS.items()]  # fmt: skip

    @tool
    def convert(self, value: float, from_unit: str, to_unit: str) -> str:
        """Convert a value from one unit to another.

        Args:
            value: the number to convert, e.g. 3.
            from_unit: its unit, e.g. "km".
            to_unit: the unit wanted, e.g. "m".
        """
        return f"{value * FACTORS[from_unit, to_unit]:g}"

    @staticmethod
    def scripted_rule(messages, tools):  # the expert (--policy scripted, SFT); it sees only the conversation
        if messages[-1].role == "tool":
            return messages[-1].content
        words = messages[-1].content.rstrip("?").split()  # How many B is V A
        return format_tool_call("convert", {"value": int(words[4]), "from_unit": words[5], "to_unit": words[2]})

    def reward(self, trajectory):  # unweighted terms; self.task is the task being played
        answer = (trajectory.final_answer or "").strip()
        called = any(call.name == "convert" for m in trajectory.messages for call in m.tool_calls)
        return {"correct": float(answer == f"{self.task.answer:g}"), "used_convert": float(called)}
