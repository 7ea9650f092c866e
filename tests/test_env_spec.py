"""``EnvSpec``: what a run knows of its env, read once from an instance that is then closed (issue 39, item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskrl.env_spec import EnvSpec, EnvSpecError, read_spec
from taskrl.envs.builtin import PriceEnv
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.scoring import Rubric
from taskrl.training.config import config_from_dict
from taskrl.training.trainer import Trainer
from taskrl.types import Task

LIVE: list[object] = []  # envs built and not yet closed
BUILT: list[object] = []


class Counted(PriceEnv):
    """A price env that records its instances, closes asynchronously, and has no test split."""

    def __init__(self) -> None:
        super().__init__()
        LIVE.append(self)
        BUILT.append(self)

    def tasks(self, split: str = "train") -> list[Task]:
        if split == "test":
            raise ValueError("Counted has no test split")
        return list(super().tasks(split))

    async def close(self) -> None:
        LIVE.remove(self)


@pytest.fixture(autouse=True)
def _clear() -> None:
    LIVE.clear()
    BUILT.clear()


def test_read_keeps_tasks_rubric_tools_and_rule_and_defers_a_refused_split() -> None:
    env = PriceEnv()
    spec = EnvSpec.read(env, ["train", "val", "train"])
    assert spec.name == "price" and list(spec.splits) == ["train", "val"]
    assert spec.tasks("train") == tuple(env.tasks("train")) and spec.tool_names == tuple(env.tools.names)
    assert spec.rubric.failure_reward == env.failure_reward and spec.scripted_rule is not None
    with pytest.raises(EnvSpecError, match="split 'test' was not read \\(read: train, val\\)"):
        spec.tasks("test")
    refused = read_spec(Counted, ["train", "test"])
    assert len(refused.tasks("train")) > 0
    with pytest.raises(ValueError, match="Counted has no test split"):  # the env's own error, when asked for
        refused.tasks("test")


def test_read_spec_closes_the_env_it_read() -> None:
    read_spec(Counted, ["train"])
    assert len(BUILT) == 1 and LIVE == []


def _config(tmp_path: Path, **changes: object):
    base = {"run_dir": str(tmp_path / "run"), "env": "price", "finetune": "lora", "lora.rank": 4, "steps": 1,
            "rollout.tasks_per_step": 1, "rollout.group_size": 2, "rollout.max_turns": 2,
            "rollout.max_new_tokens": 8, "progress": False}  # fmt: skip
    return config_from_dict({**base, **changes})


def test_the_trainer_holds_no_env_between_episodes(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0)
    trainer = Trainer(_config(tmp_path), policy=HFPolicy(model, tokenizer, device="cpu"), env_factory=Counted)
    try:
        assert len(BUILT) == 1 and LIVE == []  # the spec's env, closed at once
        assert trainer.spec.tasks("train") and trainer.rubric is trainer.spec.rubric
        trainer.train()
        assert len(BUILT) > 1 and LIVE == []  # each episode's env closed after it
        with pytest.raises(ValueError, match="Counted has no test split"):  # evaluating fails, training did not
            trainer.evaluate(1)
        trainer.config.eval_split, trainer.config.eval_tasks = "val", 1
        trainer.spec = EnvSpec.read(Counted(), ["train", "val"])  # (that env counts as one built: closed next)
        LIVE.clear()
        built = len(BUILT)
        trainer.evaluate(1)  # one episode, one env: the evaluation reads the trainer's spec, builds no probe
        assert len(BUILT) == built + 1 and LIVE == []
    finally:
        trainer.close()


def test_a_declared_spec_needs_no_env_to_start(tmp_path: Path) -> None:
    tasks = tuple(PriceEnv().tasks("train"))[:2]
    spec = EnvSpec("price", {"train": tasks}, Rubric(), tool_names=("lookup_price",))
    model, tokenizer = tiny_model(seed=0)
    trainer = Trainer(_config(tmp_path), policy=HFPolicy(model, tokenizer, device="cpu"), env_factory=Counted,
                      env_spec=spec)  # fmt: skip
    try:
        assert BUILT == [] and trainer.tasks_by_id == {t.id: t for t in tasks}
    finally:
        trainer.close()
