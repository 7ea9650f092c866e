"""Every HumanEval gold solution scores 1.0 through the two-sandbox check, and answers that game equality lose."""

from __future__ import annotations

import asyncio

import pytest

from taskrl.envs.code.env import CodeEnvConfig, HumanEvalEnv
from taskrl.envs.code.reward import CodeRewardConfig, protect, score, tree_state
from taskrl.envs.code.sandbox import SandboxConfig
from taskrl.envs.code.workspace import WorkspaceConfig, pool_for
from taskrl.types import Task

RIGGED = [
    "class Anything:\n    def __eq__(self, other):\n        return True\n",
    "class Anything(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n",
    "class Anything(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n",
]


async def _score(env: HumanEvalEnv, config: WorkspaceConfig, task: Task, solution: str) -> float:
    with pool_for(task.info["base"], config).acquire() as ws:
        ws.write_file("solution.py", solution.encode())
        protected, state = protect(ws.path), tree_state(ws.path)
        result = await score(env.sandbox, ws, task, protected, state, CodeRewardConfig(measure_coverage=False))
        return result.tests


async def test_gold_scores_one_on_all_164_and_rigged_equality_scores_zero(workspace_config: WorkspaceConfig) -> None:
    env = HumanEvalEnv(CodeEnvConfig(sandbox=SandboxConfig(timeout_s=120), workspace=workspace_config))
    tasks = env.tasks("all")
    assert len(tasks) == 164
    gate = asyncio.Semaphore(4)

    async def gold(task: Task) -> float:
        async with gate:
            return await _score(env, workspace_config, task, task.info["gold"]["write"]["solution.py"])

    scores = await asyncio.gather(*(gold(t) for t in tasks))
    assert [t.id for t, s in zip(tasks, scores, strict=True) if s != 1.0] == []

    async def rigged(task: Task, klass: str) -> float:
        entry = task.info["check"]["entry_point"]
        async with gate:
            return await _score(
                env, workspace_config, task, f"{klass}\n\ndef {entry}(*a, **k):\n    return Anything()\n"
            )

    hacked = await asyncio.gather(*(rigged(t, RIGGED[i % len(RIGGED)]) for i, t in enumerate(tasks[::4])))
    assert set(hacked) == {0.0}


@pytest.mark.parametrize("value", ["True", "1", "[1, 2]", "(1, 2)", "{'a': 1}", "None", "1.5", "float('nan')"])
def test_wire_round_trip_keeps_type_and_value(value: str) -> None:
    import importlib.util

    from taskrl.envs.code.testrun import HARNESS_DIR

    spec = importlib.util.spec_from_file_location("wire", HARNESS_DIR / "wire.py")
    wire = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(wire)  # type: ignore[union-attr]
    original = eval(value)  # noqa: S307 - literals from this test
    back = wire.decode(wire.encode(original))
    assert type(back) is type(original) and repr(back) == repr(original)
    with pytest.raises(wire.WireError):
        wire.encode(type("Sub", (int,), {})(3))
