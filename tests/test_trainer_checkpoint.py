"""Checkpoints round-trip exactly (weights, optimizer, version, RNG), are atomic and pruned; run directories
rewind to a checkpoint and refuse a resume under another config."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from taskrl.policies.models import tiny_model
from taskrl.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from taskrl.training.config import ConfigError, TrainConfig, config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.training.runs import check_resumable, completed_steps, latest_checkpoint, rewind_run_dir

CONFIG = config_from_dict({"algo.name": "ppo", "finetune": "lora", "lora.rank": 2, "lr": 1e-2})


def _learner(config: TrainConfig = CONFIG) -> Learner:
    model, _ = tiny_model(seed=0)
    return Learner(prepare_model(model, config), config)


def _train_a_little(learner: Learner) -> None:
    """One real optimizer step so that weights and Adam moments are non-trivial."""
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    loss = learner.model(input_ids=ids).logits.float().logsumexp(-1).mean()
    loss = loss + learner.value_head(torch.ones(1, learner.value_head.in_features)).sum()
    loss.backward()
    learner.optimizer.step()
    learner.optimizer.zero_grad()


def test_round_trip_restores_everything(tmp_path: Path) -> None:
    learner = _learner()
    _train_a_little(learner)
    learner.version = 7
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    path = save_checkpoint(tmp_path, 3, learner, {"sampler": {"position": 24}}, keep=2)
    expected_draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    saved = {k: v.clone() for k, v in learner.trainable_state().items()}
    assert any("lora_" in k for k in saved) and "value_head.weight" in saved

    fresh = _learner()
    state = load_checkpoint(path, fresh)
    assert state["step"] == 3 and state["sampler"] == {"position": 24} and fresh.version == 7
    for name, tensor in fresh.trainable_state().items():
        assert torch.equal(tensor, saved[name]), name
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected_draws
    moments = [s["exp_avg"] for s in fresh.optimizer.state.values()]
    assert moments and any(m.abs().sum() > 0 for m in moments)
    _train_a_little(learner)
    _train_a_little(fresh)  # the same next step from the same state
    for name, tensor in fresh.trainable_state().items():
        assert torch.equal(tensor, learner.trainable_state()[name]), name


def test_latest_pointer_pruning_and_leftover_temp_dirs(tmp_path: Path) -> None:
    learner = _learner()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / ".tmp-step_000009-1").mkdir()  # a writer killed mid-checkpoint
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, learner, {}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_000004", "step_000006"]
    assert latest_checkpoint(tmp_path).name == "step_000006" and completed_steps(tmp_path) == 6
    (tmp_path / "checkpoints" / "latest").write_text("step_000099")  # a pointer to nothing falls back
    assert latest_checkpoint(tmp_path).name == "step_000006"
    assert completed_steps(tmp_path / "nowhere") == 0


def test_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 1, _learner(), {}, keep=1)
    with pytest.raises(ValueError, match="does not fit this model/config"):
        load_checkpoint(path, _learner(CONFIG.override({"algo.name": "grpo"})))
    (path / "trainable.safetensors").write_bytes(b"torn")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, _learner())


def test_rewind_drops_what_was_logged_after_the_checkpoint(tmp_path: Path) -> None:
    rows = [{"step": s, "rewards/total": s} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "rew')
    (tmp_path / "trajectories").mkdir()
    for name in ("train_000002.jsonl", "train_000003.jsonl", "step-000003-policy_000003.jsonl"):
        (tmp_path / "trajectories" / name).write_text("")
    rewind_run_dir(tmp_path, 2)
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "trajectories").iterdir()) == ["train_000002.jsonl"]


def test_resume_refuses_a_changed_config(tmp_path: Path) -> None:
    config = config_from_dict({"run_dir": str(tmp_path)})
    check_resumable(tmp_path, config, has_checkpoint=False)  # nothing there yet
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    check_resumable(tmp_path, config.override({"steps": 500, "progress": False}), has_checkpoint=True)
    with pytest.raises(ConfigError, match=r"different config \(lr: 1e-05 -> 0.001, seed: 0 -> 1\)"):
        check_resumable(tmp_path, config.override({"lr": 1e-3, "seed": 1}), has_checkpoint=True)
    with pytest.raises(ConfigError, match="set resume=true"):
        check_resumable(tmp_path, config.override({"resume": False}), has_checkpoint=False)
