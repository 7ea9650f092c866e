"""Defence in depth on the learning path (issue 16): a step whose loss or gradient is not finite is skipped with
the weights and AdamW state untouched, counted, logged as a one-line alert (and in alerts.jsonl by the trainer);
non-finite weights are never written (checkpoint, export, adapter pushed to a server)."""

from __future__ import annotations

import asyncio
import copy
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from taskrl.env import make
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.runlog import read_alerts, read_metrics
from taskrl.training.checkpoint import NonFiniteWeightsError, save_checkpoint
from taskrl.training.config import TrainConfig, config_from_dict
from taskrl.training.learner import NONFINITE_ALERT, Learner
from taskrl.training.model import prepare_model
from taskrl.training.sync import ServerLoRASync, WeightSyncError
from taskrl.training.trainer import Trainer
from taskrl.types import Trajectory

BASE = config_from_dict({"lr": 1e-2, "max_grad_norm": 1.0, "rollout.temperature": 1.0, "progress": False,
                         "rollout.group_size": 4, "finetune": "lora", "lora.rank": 4})  # fmt: skip


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_model(seed=0)


def _sampled(tiny: tuple[Any, Any]) -> list[Trajectory]:
    policy = HFPolicy(copy.deepcopy(tiny[0]), tiny[1], device="cpu")
    tasks = list(make("price").tasks())[:2]
    config = RolloutConfig(max_turns=1, sampling=SamplingParams(max_new_tokens=5), group_size=4, seed=0)
    trajectories = asyncio.run(run_episodes(lambda: make("price"), policy, tasks, config))
    for i, t in enumerate(trajectories):
        t.rewards["synthetic"] = float(i % 3)
    return trajectories


def _learner(tiny: tuple[Any, Any], config: TrainConfig = BASE) -> Learner:
    torch.manual_seed(0)
    return Learner(prepare_model(copy.deepcopy(tiny[0]), config), config, pad_id=0)


def _poison(trajectories: list[Trajectory]) -> list[Trajectory]:
    """One NaN sampler logprob (what a tenant's temperature=1e-40 produced in issue 16): its IS weight is NaN."""
    poisoned = copy.deepcopy(trajectories)
    segment = poisoned[1].segments[0]
    position = segment.loss_mask.index(1)
    segment.logprobs[position] = float("nan")
    return poisoned


def test_a_non_finite_step_is_skipped_with_weights_and_optimizer_unchanged(
    tiny: tuple[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    trajectories = _sampled(tiny)
    learner = _learner(tiny)
    learner.update(trajectories, step=0)  # a good step first: AdamW has state to keep
    weights = {k: v.clone() for k, v in learner.trainable_state().items()}
    optimizer = copy.deepcopy(learner.optimizer.state_dict())
    with caplog.at_level(logging.WARNING, logger="taskrl.training.learner"):
        metrics = learner.update(_poison(trajectories), step=1)
    assert metrics["charts/nonfinite_skipped"] == 1.0 and metrics["charts/optimizer_steps"] == 0.0
    assert learner.version == 1  # the weights did not change: no new version
    for name, value in learner.trainable_state().items():
        assert torch.equal(value, weights[name]), name
    for key, state in learner.optimizer.state_dict()["state"].items():
        for field, value in state.items():
            assert torch.equal(value, optimizer["state"][key][field]), (key, field)
    assert all(p.grad is None for p in learner.params)
    alerts = [r.getMessage() for r in caplog.records if NONFINITE_ALERT in r.getMessage()]
    assert len(alerts) == 1 and "\n" not in alerts[0] and "optimizer step skipped" in alerts[0]
    # the next clean batch trains again
    metrics = learner.update(trajectories, step=2)
    assert metrics["charts/optimizer_steps"] == 1.0 and learner.version == 2


def test_a_non_finite_gradient_with_a_finite_loss_is_skipped(tiny: tuple[Any, Any]) -> None:
    learner = _learner(tiny, BASE.override({"finetune": "full"}))
    before = {k: v.clone() for k, v in learner.trainable_state().items()}
    weight = learner.model.get_input_embeddings().weight
    weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))  # an overflow in the backward pass
    metrics = learner.update(_sampled(tiny), step=0)
    assert math.isfinite(metrics["losses/policy_loss"]) and metrics["charts/nonfinite_skipped"] == 1.0
    assert all(torch.equal(v, before[k]) for k, v in learner.trainable_state().items())
    assert learner.optimizer.state_dict()["state"] == {}


def test_non_finite_weights_are_never_written(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    learner = _learner(tiny)
    save_checkpoint(tmp_path, 1, learner, {}, keep=2)  # finite: written
    name, tensor = next((n, t) for n, t in learner.trainable_state().items() if "lora_B" in n)
    with torch.no_grad():
        tensor[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match=rf"refusing to write checkpoint step 2: 1 trainable.*{name}"):
        save_checkpoint(tmp_path, 2, learner, {}, keep=2)
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_000001"]
    assert (checkpoints / "latest").read_text() == "step_000001"

    class Server:  # only the adapter save runs: the check comes before any request
        base_url, version = "http://127.0.0.1:9/v1", 0

    sync = ServerLoRASync(learner, Server(), adapters_dir=tmp_path / "adapters", base_model="m")  # type: ignore[arg-type]
    with pytest.raises(WeightSyncError, match="refusing to write adapter v3 for the rollout server"):
        sync(3)
    assert not (tmp_path / "adapters").exists()


def test_trainer_refuses_to_export_poisoned_weights(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    config = BASE.override({"run_dir": str(tmp_path / "run"), "env": "price", "steps": 1, "rollout.tasks_per_step": 1,
                            "rollout.group_size": 2, "checkpoint_every": 0})  # fmt: skip
    trainer = Trainer(config, policy=HFPolicy(copy.deepcopy(tiny[0]), tiny[1], device="cpu"))
    try:
        with torch.no_grad():
            next(iter(trainer.learner.trainable_state().values())).fill_(float("inf"))
        with pytest.raises(NonFiniteWeightsError, match="refusing to write the policy export"):
            trainer.export(tmp_path / "export")
        assert not (tmp_path / "export").exists()
    finally:
        trainer.close()


def test_trainer_logs_the_skipped_step_in_metrics_and_alerts(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    config = BASE.override({"run_dir": str(tmp_path / "run"), "env": "price", "steps": 1, "rollout.tasks_per_step": 2,
                            "rollout.group_size": 4, "rollout.max_turns": 1, "rollout.max_new_tokens": 5,
                            "checkpoint_every": 0})  # fmt: skip
    trainer = Trainer(config, policy=HFPolicy(copy.deepcopy(tiny[0]), tiny[1], device="cpu"))
    try:

        def score(step: int, trajectories: list[Trajectory]) -> None:
            for i, t in enumerate(trajectories):
                t.terms["synthetic"] = float(i % 3)
            trajectories[1].segments[0].logprobs[trajectories[1].segments[0].loss_mask.index(1)] = float("nan")

        trainer.score_fn = score
        trainer.train()
    finally:
        trainer.close()
    row = read_metrics(config.run_dir)[-1]
    assert row["charts/nonfinite_skipped"] == 1.0 and row["charts/policy_version"] == 0.0
    alerts = [a for a in read_alerts(config.run_dir) if a["monitor"] == NONFINITE_ALERT]
    assert len(alerts) == 1 and alerts[0]["step"] == 1 and "skipped" in alerts[0]["message"]
