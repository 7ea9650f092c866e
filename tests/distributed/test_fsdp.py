"""The FSDP2 learner (``learner_backend="fsdp2"``) on 2 gloo processes: one sharded update equals the 1-process
update on the same trajectories (full fine-tuning and LoRA, GRPO and PPO), each rank holds about half of the
parameter + AdamW bytes, and a sharded checkpoint resumes on 2 -> 1 and 1 -> 2 ranks to the same next step as an
uninterrupted run. One group of 2 ranks serves every test (starting one costs seconds of imports per rank)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from taskrl.distributed.ddp import DataParallel, spawn
from taskrl.distributed.launch import train_rank
from taskrl.policies.models import tiny_model
from taskrl.runlog import read_metrics
from taskrl.training.checkpoint import load_checkpoint, save_checkpoint
from taskrl.training.config import ConfigError, TrainConfig, config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.memory import optimizer_bytes, tensor_bytes
from taskrl.training.model import prepare_model
from taskrl.training.trainer import train
from taskrl.types import Segment, Trajectory

BASE = config_from_dict({"lr": 1e-3, "max_grad_norm": 0.5, "rollout.temperature": 1.0, "progress": False,
                         "rollout.group_size": 3, "placement.learner_backend": "fsdp2",
                         "placement.rollout_policy": "copy"})  # fmt: skip

CASES: list[tuple[dict[str, Any], int]] = [
    # (config changes, trajectories on rank 0; rank 1 gets the rest). 9 trajectories = 3 groups of 3.
    ({"finetune": "full", "epochs_per_batch": 2, "minibatches": 2}, 6),  # uneven shares, 4 optimizer steps
    ({"finetune": "lora", "lora.rank": 4, "kl": "k1_reward", "kl_coef": 0.1}, 3),  # reference = adapter disabled
    ({"finetune": "full", "algo.name": "ppo"}, 9),  # value head + GAE; rank 1 has nothing, yet joins every collective
    ({"finetune": "lora", "lora.rank": 4, "algo.name": "ppo", "gradient_checkpointing": True}, 6),
]
RESUME = {"finetune": "full", "minibatches": 2}
"""The config of the resume tests (full fine-tuning: every weight and its AdamW state is sharded)."""


def _learner(config: TrainConfig) -> Learner:
    model = AutoModelForCausalLM.from_pretrained(config.model)
    torch.manual_seed(1)  # LoRA and value-head init: the same on every rank and in the reference process
    prepared = prepare_model(model, config)
    return Learner(prepared, config, pad_id=0, data_parallel=DataParallel.from_process_group())


def _full(learner: Learner) -> dict[str, np.ndarray]:
    return {name: t.numpy().copy() for name, t in learner.gathered_state()}


def _bytes(learner: Learner) -> int:
    return tensor_bytes(p for _, p in learner.named_trainable_params()) + optimizer_bytes(learner.optimizer)


def _update(config: TrainConfig, trajectories: list[Trajectory]) -> dict[str, Any]:
    learner = _learner(config)
    metrics = learner.update(trajectories, step=0)
    return {"weights": _full(learner), "metrics": metrics, "bytes": _bytes(learner), "sharded": learner.sharded}


def _own(trajectories: list[Trajectory], split: int, group: DataParallel) -> list[Trajectory]:
    return trajectories[:split] if group.rank == 0 else trajectories[split:]


def _train_config(root: Path, model: str) -> TrainConfig:
    """A 2-rank `taskrl train` run: LoRA, the rollout copy synced from the shards, a checkpoint every step."""
    return config_from_dict({"run_dir": str(root / "run"), "model": model, "device": "cpu", "env": "price",
                             "finetune": "lora", "lora.rank": 4, "steps": 2, "lr": 1e-2, "kl": "k1_reward",
                             "kl_coef": 0.5, "rollout.tasks_per_step": 2, "rollout.group_size": 2,
                             "rollout.max_turns": 1, "rollout.max_new_tokens": 6, "sft_warmup_steps": 1,
                             "sft_data": "policy", "sft_min_reward": 0.0, "sft_lr": 1e-2, "checkpoint_every": 1,
                             "progress": False, "placement.nproc": 2, "placement.learner_backend": "fsdp2",
                             "placement.rollout_policy": "copy"})  # fmt: skip


def _rank_main(trajectories: list[Trajectory], model: str, root: str) -> dict[str, Any]:
    """Each of 2 ranks: every update case on its share; then step 0, a checkpoint, step 1 (uninterrupted); then a
    resume of the 1-process checkpoint and its step 1; then a whole training run."""
    group = DataParallel.from_process_group()
    cases = [_update(BASE.override({"model": model, **changes}), _own(trajectories, split, group))
             for changes, split in CASES]  # fmt: skip
    config = BASE.override({"model": model, **RESUME})
    learner = _learner(config)
    learner.update(_own(trajectories, 6, group), step=0)  # whole groups per rank, as the trainer deals them
    save_checkpoint(Path(root) / "two", 1, learner, {}, keep=2)
    learner.update(_own(trajectories, 3, group), step=1)
    uninterrupted = _full(learner)
    resumed = _learner(config)
    load_checkpoint(Path(root) / "one" / "checkpoints" / "step_000001", resumed)
    resumed.update(_own(trajectories, 3, group), step=1)
    out = {"rank": group.rank, "cases": cases, "uninterrupted": uninterrupted, "from_one": _full(resumed)}
    return {**out, "run": train_rank(_train_config(Path(root), model))}


@pytest.fixture(scope="module")
def trajectories() -> list[Trajectory]:
    """3 groups of 3 fixed episodes: a shared prompt, answers of different lengths around a tool output (mask 0)."""
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(n)]

    out = []
    for g in range(3):
        prompt = ids(24)
        for k in range(3):
            segment = Segment()
            segment.append(prompt, sampled=False)
            answer, call = 3 + 4 * g + 2 * k, 2 + k
            segment.append(ids(answer), sampled=True, logprobs=[-10.8 + rng.uniform(-0.8, 0.8) for _ in range(answer)])
            segment.append(ids(6), sampled=False)
            segment.append(ids(call), sampled=True, logprobs=[-10.8 + rng.uniform(-0.8, 0.8) for _ in range(call)])
            rewards: dict[str, float | None] = {"score": float((g * 3 + k) * 7 % 4)}
            out.append(Trajectory(task_id=f"t{g}", group_id=f"t{g}#0", segments=[segment], rewards=rewards))
    return out


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, trajectories: list[Trajectory], one_thread: None) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fsdp")
    model_dir = root / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    # 1 process (fsdp2 without a group: unsharded, but the same sharded checkpoint format): step 0 and a checkpoint
    config = BASE.override({"model": str(model_dir), **RESUME})
    single = _learner(config)
    assert not single.sharded
    single.update(trajectories, step=0)
    save_checkpoint(root / "one", 1, single, {}, keep=2)
    ranks = spawn(_rank_main, 2, (trajectories, str(model_dir), str(root)))
    assert [r["rank"] for r in ranks] == [0, 1]
    return {"root": root, "model": str(model_dir), "ranks": ranks}


def test_sharded_update_equals_one_process_update(trajectories: list[Trajectory], run: dict[str, Any]) -> None:
    for index, (changes, _) in enumerate(CASES):
        # the 1-process reference: the plain (DDP-path) learner on all 9 trajectories
        reference = _update(BASE.override({"model": run["model"], "placement.learner_backend": "ddp", **changes}),
                            trajectories)
        assert not reference["sharded"]
        initial = _full(_learner(BASE.override({"model": run["model"], **changes})))
        moved = max(float(np.abs(reference["weights"][n] - w).max()) for n, w in initial.items())
        assert moved > 5e-4, "the update must move the weights for the comparison to mean anything"
        for rank in run["ranks"]:
            got = rank["cases"][index]
            assert got["sharded"], changes
            assert got["weights"].keys() == reference["weights"].keys()
            for name, want in reference["weights"].items():
                np.testing.assert_allclose(got["weights"][name], want, rtol=0, atol=1e-5, err_msg=f"{changes} {name}")
            for key in ("charts/trained_tokens", "charts/groups", "charts/optimizer_steps", "charts/policy_version"):
                assert got["metrics"].get(key) == reference["metrics"].get(key), (changes, key)
            for key in ("losses/policy_loss", "losses/grad_norm", "losses/mismatch_kl", "losses/value_loss"):
                if key in reference["metrics"]:
                    assert got["metrics"][key] == pytest.approx(reference["metrics"][key], rel=1e-4, abs=1e-6), key


def test_each_rank_holds_about_half_the_parameter_and_optimizer_bytes(run: dict[str, Any]) -> None:
    for index, (changes, _) in enumerate(CASES):
        config = BASE.override({"model": run["model"], "placement.learner_backend": "ddp", **changes})
        learner = _learner(config)
        learner.update(_trajectories_for_bytes(), step=0)
        one_process = _bytes(learner)
        for rank in run["ranks"]:
            share = rank["cases"][index]["bytes"] / one_process
            assert 0.45 <= share <= 0.56, (changes, share)


def _trajectories_for_bytes() -> list[Trajectory]:
    segment = Segment()
    segment.append(list(range(100, 120)), sampled=False)
    segment.append(list(range(200, 206)), sampled=True, logprobs=[-9.0] * 6)
    return [Trajectory(task_id="t", group_id="g", segments=[segment], rewards={"r": float(k)}) for k in range(2)]


def test_resume_2_to_1_and_1_to_2_ranks_gives_the_uninterrupted_next_step(
    trajectories: list[Trajectory], run: dict[str, Any]
) -> None:
    ranks = run["ranks"]
    for name, value in ranks[0]["uninterrupted"].items():
        np.testing.assert_array_equal(ranks[1]["uninterrupted"][name], value)
    # 1 process, uninterrupted: steps 0 and 1 (the same global batches as the ranks' shares together)
    config = BASE.override({"model": run["model"], **RESUME})
    single = _learner(config)
    single.update(trajectories, step=0)
    single.update(trajectories, step=1)
    uninterrupted = _full(single)
    # 2 -> 1: the ranks' sharded checkpoint of step 0, loaded by one process
    resumed = _learner(config)
    meta = load_checkpoint(run["root"] / "two" / "checkpoints" / "step_000001", resumed)
    assert meta["world"] == 2 and resumed.version == 1
    resumed.update(trajectories, step=1)
    for name, want in uninterrupted.items():
        np.testing.assert_allclose(ranks[0]["uninterrupted"][name], want, rtol=0, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(_full(resumed)[name], want, rtol=0, atol=1e-5, err_msg=f"2->1 {name}")
        for rank in ranks:  # 1 -> 2: the 1-process checkpoint, loaded by both ranks
            np.testing.assert_allclose(rank["from_one"][name], want, rtol=0, atol=1e-5, err_msg=f"1->2 {name}")


def test_fsdp2_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="placement.learner_backend must be one of ddp, fsdp2"):
        config_from_dict({"placement.learner_backend": "zero3"})
    with pytest.raises(ConfigError, match="placement.learner_backend 'fsdp2' with nproc > 1 needs rollout_policy"):
        config_from_dict({"placement.learner_backend": "fsdp2", "placement.nproc": 2})
    config_from_dict({"placement.learner_backend": "fsdp2", "placement.nproc": 2, "placement.rollout_policy": "copy"})


def test_two_rank_training_run_syncs_checkpoints_exports_and_resumes_on_one(run: dict[str, Any]) -> None:
    """`taskrl train` with nproc=2, fsdp2: both ranks end on the same (gathered) weights, the checkpoints are sharded,
    the export is the consolidated adapter; the run then resumes on 1 process for a third step."""
    ranks = [r["run"] for r in run["ranks"]]
    assert ranks[0].weights_digest == ranks[1].weights_digest
    assert [row["charts/policy_version"] for row in ranks[0].rows] == [1.0, 2.0]
    assert all(row["charts/sync_failed"] == 0.0 for row in ranks[0].rows)
    config = _train_config(run["root"], run["model"])
    checkpoint = Path(config.run_dir) / "checkpoints" / "step_000002"
    assert (checkpoint / "dcp" / ".metadata").is_file() and not (checkpoint / "trainable.safetensors").exists()
    assert (Path(config.run_dir) / "policy" / "adapter_model.safetensors").is_file()
    rows = train(config.override({"placement.nproc": 1, "steps": 3}))
    assert len(rows) == 1 and rows[0]["charts/policy_version"] == 3.0
    assert [row["step"] for row in read_metrics(config.run_dir)] == [1, 2, 3]
