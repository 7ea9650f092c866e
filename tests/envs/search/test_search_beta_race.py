"""Two batches of search episodes in flight at once at different training clocks (an async rollout beside an
evaluation at an epoch boundary): each episode's F_β must be scored at its own batch's β.

Before issue 39 the rollout told each env its batch's clock (``set_step`` from ``RolloutConfig.clock``) before
reset, and the search env moved β on the one reward object shared by every env on its corpus in the process; an
episode measured F_β at its end, at whatever β the last episode to start had set: the epoch-0 batch scored F_β
0.833 (β 2) instead of 0.944 (β 4). Now the env measures precision and recall only and ``score`` derives F_β at
the clock it is given."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskrl.envs.search.env import SearchEnv
from taskrl.envs.search.store import CorpusStore
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.formulas import f_beta
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.scoring import Clock, score_collected
from taskrl.types import Message, Trajectory


def _padded_oracle(messages: list[Message], tools: Any) -> str:
    """The oracle, listing one document that supports nothing after its own: precision < 1, recall 1, so F_β
    depends on β."""
    text = SearchEnv.scripted_rule(messages, tools)
    return text + ", no_such_doc" if "DOCUMENTS:" in text else text


def test_concurrent_batches_at_two_clocks_each_get_their_own_beta(planted_corpus: CorpusStore) -> None:
    factory = lambda: SearchEnv(corpus=str(planted_corpus.path), reward={"beta_anneal_epochs": 4})  # noqa: E731
    tasks = list(factory().tasks("train"))[:4]
    policy = ScriptedPolicy(_padded_oracle)
    clocks = (Clock(step=0, epoch=0), Clock(step=40, epoch=4))  # β 4 (training) and β 2 (evaluation)

    async def both() -> list[list[Trajectory]]:
        return list(await asyncio.gather(*(
            run_episodes(factory, policy, tasks, RolloutConfig(max_turns=6, training=clock.epoch == 0))
            for clock in clocks
        )))  # fmt: skip

    assert not hasattr(factory(), "set_step")  # the env is told nothing about training
    batches = asyncio.run(both())
    for batch, clock, beta in zip(batches, clocks, (4.0, 2.0), strict=True):
        score_collected(batch, factory(), clock)  # as the trainer and eval score a batch, at its own clock
        for traj in batch:
            assert traj.error is None and traj.terminated
            precision, recall = traj.metrics["search/output_precision"], traj.metrics["search/output_recall"]
            assert 0 < precision < 1 and recall == 1.0
            assert traj.terms["f_beta"] == pytest.approx(f_beta(precision, recall, beta)), (clock, traj.task_id)
            assert traj.rewards["f_beta"] == pytest.approx(0.7 * traj.terms["f_beta"])
