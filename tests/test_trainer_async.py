"""async_rollout on a tiny model: step k+1's episodes play while step k updates, samples stay within the
staleness bound, stale ones are dropped, identical seeds give identical runs, and a resumed run continues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_trainer_learning import ChatEnv, even_token_share  # the same trivially learnable task

from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.runlog import read_metrics, read_trajectories
from taskrl.training.config import ConfigError, TrainConfig, config_from_dict
from taskrl.training.trainer import Trainer
from taskrl.types import Trajectory


def _config(tmp_path: Path, name: str = "run", **changes: Any) -> TrainConfig:
    base = {"run_dir": str(tmp_path / name), "env": "price", "lora.rank": 4, "lr": 1e-2, "steps": 5,
            "rollout.tasks_per_step": 2, "rollout.group_size": 2, "rollout.max_turns": 2, "rollout.max_new_tokens": 8,
            "checkpoint_every": 2,
            "progress": False, "placement.rollout_policy": "copy", "rollout.async_rollout": True,
            "seed": 1}  # fmt: skip
    return config_from_dict({**{**base, **changes}})


def spread(step: int, trajectories: list[Trajectory]) -> None:
    """A reward that differs inside every group, so every GRPO step updates (and makes a new version)."""
    for i, t in enumerate(trajectories):
        t.terms["spread"] = 0.25 * (i % 2)


def _trainer(config: TrainConfig) -> Trainer:
    model, tokenizer = tiny_model(seed=0)
    return Trainer(config, policy=HFPolicy(model, tokenizer, device="cpu"), score_fn=spread)


def _run(config: TrainConfig, until: int | None = None) -> list[dict[str, Any]]:
    trainer = _trainer(config)
    try:
        return trainer.train(until)
    finally:
        trainer.close()


def test_rollouts_overlap_updates_within_the_staleness_bound(tmp_path: Path) -> None:
    rows = _run(_config(tmp_path))
    assert len(rows) == 5 and all(r["charts/trained_tokens"] > 0 for r in rows)
    assert [r["charts/policy_version"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0]
    for k in range(4):  # step k+1's episodes started before step k's update ended: they overlapped it
        assert rows[k + 1]["timeline/rollout_start_s"] < rows[k]["timeline/update_end_s"], k
        assert rows[k + 1]["timeline/rollout_start_s"] >= rows[k]["timeline/rollout_end_s"], k  # one step ahead
    assert rows[0]["charts/staleness_max"] == 0.0
    assert all(r["charts/staleness_max"] == 1.0 <= 2 and r["charts/stale_dropped"] == 0.0 for r in rows[1:])
    assert all(r["charts/rollout_wait_s"] >= 0.0 and "charts/staleness_mean" in r for r in rows)
    # The samples of step k carry the version synced when they started: that after update k-2.
    trajectories = read_trajectories(Path(tmp_path / "run"))
    for step, batch in trajectories.items():
        expected = max(step - 2, 0)
        assert {s.policy_version for t in batch for s in t.segments if s.num_sampled} == {expected}, step


def test_max_staleness_0_drops_the_overlapped_samples(tmp_path: Path) -> None:
    rows = _run(_config(tmp_path, steps=3, **{"rollout.max_staleness": 0}))
    # Step 2 was sampled during update 1, one version behind: all dropped, so no update and no new version;
    # step 3 was then sampled from the current version and trains again.
    assert rows[1]["charts/stale_dropped"] == rows[1]["charts/offered_trajectories"] > 0
    assert rows[1]["charts/trained_tokens"] == 0.0
    assert [r["charts/policy_version"] for r in rows] == [1.0, 1.0, 2.0]
    assert rows[2]["charts/stale_dropped"] == 0.0


def test_async_runs_repeat_exactly_and_resume(tmp_path: Path) -> None:
    first = _run(_config(tmp_path, "a", steps=4))
    second = _run(_config(tmp_path, "b", steps=4))
    compared = ("rewards/total", "losses/policy_loss", "charts/sampled_tokens", "charts/staleness_mean")
    for a, b in zip(first, second, strict=True):
        for key in compared:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    a_steps, b_steps = read_trajectories(tmp_path / "a"), read_trajectories(tmp_path / "b")
    assert [[t.segments[0].token_ids for t in a_steps[s]] for s in a_steps] == [
        [t.segments[0].token_ids for t in b_steps[s]] for s in b_steps
    ]

    # Stop after 2 steps (checkpoint 2), go on in a new trainer: the restored version is synced into the copy.
    _run(_config(tmp_path, "c", steps=4), until=2)
    resumed = _trainer(_config(tmp_path, "c", steps=4))
    try:
        rows = resumed.train()
        assert resumed.policy.version == resumed.learner.version == 4
    finally:
        resumed.close()
    assert rows[0]["charts/staleness_max"] == 0.0  # the first resumed step samples the checkpoint's weights
    assert [r["step"] for r in read_metrics(tmp_path / "c")] == [1, 2, 3, 4]


def test_async_needs_a_separate_rollout_policy(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rollout.async_rollout needs placement.rollout_policy copy, server or vllm"):
        _config(tmp_path, **{"placement.rollout_policy": "inprocess"})
    with pytest.raises(ConfigError, match="placement.rollout_policy must be one of inprocess, copy, server, vllm"):
        _config(tmp_path, **{"placement.rollout_policy": "gpu"})




def test_async_grpo_still_learns(tmp_path: Path) -> None:
    """test_trainer_learning's task, with every batch one version stale: the IS-corrected update still climbs."""
    model, tokenizer = tiny_model(seed=1)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)
    config = config_from_dict({"run_dir": str(tmp_path / "run"), "env": "chat", "algo.name": "grpo",
                               "finetune": "full", "freeze": ["layers",
                                                              "norm"], "lr": 1e-2, "steps": 15,
                                                              "rollout.tasks_per_step": 4, "rollout.group_size": 8,
                                                              "rollout.max_turns": 1, "rollout.max_new_tokens": 4,
                                                              "seed": 0, "checkpoint_every": 0, "progress": False,
                                                              "placement.rollout_policy": "copy",
                                                              "rollout.async_rollout": True})  # fmt: skip
    trainer = Trainer(config, policy=HFPolicy(model, tokenizer, device="cpu"), env_factory=ChatEnv,
                      score_fn=even_token_share)  # fmt: skip
    try:
        rows = trainer.train()
        ids = torch.tensor([[1, 2, 3, 4, 5]])
        with torch.no_grad():  # tied embeddings stay tied in the copy: it samples exactly the trained model
            assert torch.equal(trainer.policy.model(input_ids=ids).logits, model(input_ids=ids).logits)
    finally:
        trainer.close()
    rewards = [r["rewards/total"] for r in rows]
    first, last = sum(rewards[:2]) / 2, sum(rewards[-3:]) / 3
    # Step j samples the version after update j-2 and trains after update j-1: one behind when update j-1 made a
    # new version (a step whose groups all tie makes none).
    versions = [0.0, *(r["charts/policy_version"] for r in rows)]
    expected = [versions[j] - versions[max(j - 1, 0)] for j in range(len(rows))]
    assert [r["charts/staleness_max"] for r in rows] == expected
    assert first < 0.8 and last >= first + 0.2 and last >= 0.9, rewards
