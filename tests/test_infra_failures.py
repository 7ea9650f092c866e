"""Infrastructure failures (a broken sandbox, a failed engine request) leave their GRPO group: counted, never
scored 0 into the advantages; the policy's own errors (malformed tool calls) are scored as before."""

from __future__ import annotations

from typing import Any

import pytest

from taskrl.algos.grpo import group_advantages
from taskrl.chat import ChatFormat
from taskrl.env import make
from taskrl.envs.builtin import ShopEnv, lookup
from taskrl.envs.code.sandbox import SandboxError
from taskrl.policies.base import Completion, PolicyError
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.terms import OutputAgreement
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.scoring import Clock, Rubric, TermWeight, batch_metrics, score_collected
from taskrl.tools import tool
from taskrl.training.filters import InfraFailureError, check_infra_failures
from taskrl.training.learner import usable_trajectories
from taskrl.types import Trajectory

GROUP = 6
MASK = 0x7FFFFFFF
RUBRIC = Rubric(group_terms=[TermWeight("stability", 0.5, fn=OutputAgreement())])
"""Shop's own correctness term plus a group term, so a member's score depends on the others of its group."""


def episode_key(seed: int) -> int:
    """The loop's turn-0 sampling seed of the episode with this seed (turn t's is this + t)."""
    return (seed * 1_000_003) & MASK


class Mixed(ScriptedPolicy):
    """The shop expert on some episodes, a wrong answer or a malformed tool call (the policy's own errors) on
    others, chosen by episode; the episodes in ``engine_down`` lose their engine (a server's HTTP 500)."""

    def __init__(self, fmt: ChatFormat, engine_down: frozenset[int] = frozenset()) -> None:
        super().__init__(make("shop").scripted_rule, chat_format=fmt)
        self.engine_down = engine_down

    async def generate(self, **kwargs: Any) -> Completion:
        turns = sum(m.role == "assistant" for m in kwargs["messages"])
        episode = (kwargs["sampling"].seed - turns) & MASK
        if episode in self.engine_down:
            raise PolicyError("HTTP 500 from the engine: upstream connection reset")
        if turns == 0 and episode % 3 == 1:
            return self._say('<tool_call>{"name": "lookup_price", "arguments": {broken</tool_call>')
        if episode % 3 != 2:
            return self._say("The total is 1.")
        return await super().generate(**kwargs)

    def _say(self, text: str) -> Completion:
        ids = self.chat_format.tokenizer.encode(text, add_special_tokens=False)  # type: ignore[union-attr]
        return Completion(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop")


class SandboxedShop(ShopEnv):
    """The shop whose price lookup runs in a sandbox that cannot start for the tasks in ``broken``."""

    def __init__(self, broken: frozenset[str]) -> None:
        super().__init__()
        self.broken = broken

    @tool
    def lookup_price(self, item: str) -> str:
        """Look up the unit price of one item.

        Args:
            item: the item's name.
        """
        if self.task is not None and self.task.id in self.broken:
            raise SandboxError("could not start the sandbox (bwrap): [Errno 11] Resource temporarily unavailable")
        return lookup(item)


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return ChatFormat(smollm2_tokenizer())


async def collect(
    fmt: ChatFormat, *, engine_down: frozenset[int] = frozenset(), broken: frozenset[str] = frozenset()
) -> list[Trajectory]:
    tasks = list(make("shop").tasks())[:3]
    config = RolloutConfig(group_size=GROUP, seed=7, engine_failures="drop")
    trajectories = await run_episodes(lambda: SandboxedShop(broken), Mixed(fmt, engine_down), tasks, config)
    score_collected(trajectories, make("shop"), Clock(), rubric=RUBRIC)
    return trajectories


def advantages_by_episode(trajectories: list[Trajectory]) -> dict[tuple[str, int | None], float | None]:
    """What the learner computes: GRPO advantages over the trajectories it may learn from."""
    usable = usable_trajectories(trajectories)
    result = group_advantages([t.reward for t in usable], [t.group_id for t in usable])
    return {(t.task_id, t.seed): a for t, a in zip(usable, result.advantages, strict=True)}


async def test_injected_infra_failures_leave_the_rest_of_the_group_as_a_clean_group(fmt: ChatFormat) -> None:
    clean = await collect(fmt)
    assert not any(t.infra_failure for t in clean)
    malformed = [t for t in clean if t.metrics["invalid_tool_calls"]]
    assert malformed and all(t.reward == 0.0 and t.trainable for t in malformed)  # the policy's own error: scored
    tasks = list(dict.fromkeys(t.task_id for t in clean))
    victims = [t for t in clean if t.task_id == tasks[0]][:2]  # two episodes of the first group lose their engine
    engine_down = frozenset(episode_key(t.seed) for t in victims)  # type: ignore[arg-type]
    faulty = await collect(fmt, engine_down=engine_down, broken=frozenset({tasks[1]}))  # group 2: sandbox breaks

    failed = [t for t in faulty if t.infra_failure is not None]
    by_task = {task: [t.infra_failure["source"] for t in failed if t.task_id == task] for task in tasks}  # type: ignore[index]
    assert by_task[tasks[0]] == ["engine", "engine"]
    sandbox_fails = len(by_task[tasks[1]])
    assert by_task[tasks[1]] == ["sandbox"] * sandbox_fails and sandbox_fails >= 2 and not by_task[tasks[2]]
    assert all(not t.trainable and t.error for t in failed)
    assert batch_metrics(faulty)["charts/infra_failures"] == len(failed)  # counted
    assert batch_metrics(faulty)["charts/infra_failures"] == len(failed)

    # The rest of each group scores and trains exactly as a clean group made of those episodes alone.
    failed_keys = {(t.task_id, t.seed) for t in failed}
    clean_rest = [t for t in clean if (t.task_id, t.seed) not in failed_keys]
    score_collected(clean_rest, make("shop"), Clock(), rubric=RUBRIC)
    expected = advantages_by_episode(clean_rest)
    got = advantages_by_episode(faulty)
    assert set(got) == set(expected) == {(t.task_id, t.seed) for t in clean_rest}
    assert got == pytest.approx(expected)
    assert any(a for a in got.values()), "the groups must carry signal for this test to mean anything"
    survivors = {(t.task_id, t.seed): t.reward for t in faulty if t.infra_failure is None}
    assert survivors == pytest.approx({(t.task_id, t.seed): t.reward for t in clean_rest})


def test_a_step_where_every_episode_failed_its_infrastructure_stops_the_run() -> None:
    trajectories = [Trajectory(task_id="a"), Trajectory(task_id="a")]
    for t in trajectories:
        t.mark_infra_failure("engine", "PolicyError: connection refused")
    with pytest.raises(InfraFailureError, match="all 2 episodes failed.*engine.*connection refused"):
        check_infra_failures(3, trajectories)
    trajectories.append(Trajectory(task_id="a"))
    check_infra_failures(3, trajectories)  # one survivor: the step goes on


class EngineDown(ScriptedPolicy):
    async def generate(self, **kwargs: Any) -> Completion:
        raise PolicyError("HTTP 500 from the engine: upstream connection reset")


async def test_engine_failures_stop_the_run_unless_asked_to_drop(fmt: ChatFormat) -> None:
    tasks = list(make("shop").tasks())[:1]
    policy = EngineDown(make("shop").scripted_rule, chat_format=fmt)
    with pytest.raises(PolicyError, match="HTTP 500"):
        await run_episodes(lambda: make("shop"), policy, tasks, RolloutConfig(group_size=2))
    dropped = await run_episodes(
        lambda: make("shop"), policy, tasks, RolloutConfig(group_size=2, engine_failures="drop")
    )
    assert [t.infra_failure["source"] for t in dropped] == ["engine", "engine"]  # type: ignore[index]
