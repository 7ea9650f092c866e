"""Mixed precision: bf16 is chosen automatically only where the hardware accelerates it (and the log says why);
a bf16 learner (autocast over fp32 master weights) or a bf16 rollout copy on an unchanged policy keeps the
importance weights near 1, and the sampler/learner gap is measured as losses/mismatch_kl."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from taskrl.env import make
from taskrl.policies import precision
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.runlog import read_metrics
from taskrl.training.config import ConfigError, config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.training.sync import CopySync, rollout_copy
from taskrl.training.trainer import train
from taskrl.types import Trajectory

BASE = config_from_dict(
    {
        "lr": 1e-3,
        "max_grad_norm": 1.0,
        "rollout.temperature": 1.0,
        "progress": False,
        "rollout.group_size": 4,
        "finetune": "full",
    }
)


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    model, tokenizer = tiny_model(seed=0)
    return model, tokenizer


def _sample(policy: Any) -> list[Trajectory]:
    tasks = list(make("price").tasks())[:2]
    config = RolloutConfig(max_turns=1, sampling=SamplingParams(max_new_tokens=8), group_size=4, seed=0)
    trajectories = asyncio.run(run_episodes(lambda: make("price"), policy, tasks, config))
    for i, t in enumerate(trajectories):
        t.rewards["synthetic"] = float(i % 3)
    return trajectories


def test_auto_picks_bf16_only_where_the_hardware_accelerates_it(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert precision.resolve("auto", cpu) == (torch.bfloat16, "auto: CPU has avx512_bf16")
    dtype, line = precision.learner_autocast("auto", cpu)
    assert dtype == torch.bfloat16 and "bfloat16 autocast over fp32 master weights" in line and "avx512_bf16" in line
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert precision.resolve("auto", cpu) == (torch.float32, "auto: CPU lacks amx_bf16/avx512_bf16, so float32")
    assert precision.learner_autocast("auto", cpu)[0] is None
    assert precision.learner_autocast("bfloat16", cpu)[0] == torch.bfloat16  # asked for explicitly: honoured
    assert precision.resolve("same", cpu, same=torch.float16)[0] == torch.float16
    # this machine's own answer matches its /proc/cpuinfo
    monkeypatch.undo()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    expected = "amx_bf16" in flags.split() or "avx512_bf16" in flags.split()
    assert precision.bf16_accelerated(cpu)[0] == expected


def test_precision_fields_are_validated() -> None:
    with pytest.raises(ConfigError, match="TrainConfig.learner_precision must be one of float32, bfloat16, auto"):
        config_from_dict({"learner_precision": "fp8"})
    with pytest.raises(ConfigError, match="placement.rollout_dtype must be 'same' unless rollout_policy='copy'"):
        config_from_dict({"placement.rollout_dtype": "bfloat16"})
    config_from_dict({"placement.rollout_dtype": "bfloat16", "placement.rollout_policy": "copy"})


def test_bf16_learner_on_an_unchanged_policy_keeps_is_weights_near_one(tiny: tuple[Any, Any]) -> None:
    trajectories = _sample(HFPolicy(copy.deepcopy(tiny[0]), tiny[1], device="cpu"))  # an fp32 sampler
    results = {}
    for choice in ("float32", "bfloat16"):
        config = BASE.override({"learner_precision": choice})
        learner = Learner(prepare_model(copy.deepcopy(tiny[0]), config), config, pad_id=0)
        assert all(p.dtype == torch.float32 for p in learner.params)  # master weights stay fp32
        metrics = learner.update(copy.deepcopy(trajectories), step=0)
        assert all(p.dtype == torch.float32 for p in learner.params)
        results[choice] = metrics
    assert results["float32"]["losses/mismatch_kl"] < 1e-8
    assert results["float32"]["losses/is_weight"] == pytest.approx(1.0, abs=1e-4)
    bf16 = results["bfloat16"]
    assert 1e-7 < bf16["losses/mismatch_kl"] < 0.01, bf16["losses/mismatch_kl"]
    assert bf16["losses/is_weight"] == pytest.approx(1.0, abs=0.05)
    assert bf16["losses/ratio"] == pytest.approx(1.0, abs=1e-6)  # learner vs itself: still exactly on-policy


def test_bf16_rollout_copy_is_synced_and_corrected(tiny: tuple[Any, Any]) -> None:
    config = BASE.override({"placement.rollout_policy": "copy", "placement.rollout_dtype": "bfloat16"})
    learner_policy = HFPolicy(copy.deepcopy(tiny[0]), tiny[1], device="cpu")
    learner_policy.model = prepare_model(learner_policy.model, config)
    rollout = rollout_copy(learner_policy, torch.bfloat16)
    learner = Learner(learner_policy.model, config, pad_id=0)
    sync = CopySync(learner, rollout)
    assert all(p.dtype == torch.bfloat16 for p in rollout.model.parameters())
    metrics = learner.update(_sample(rollout), step=0)
    assert 1e-8 < metrics["losses/mismatch_kl"] < 0.05  # > 0: the bf16 copy samples with other numerics
    assert metrics["losses/is_weight"] == pytest.approx(1.0, abs=0.1)
    sync(learner.version)
    for name, param in rollout.model.named_parameters():
        want = dict(learner.model.named_parameters())[name].detach().to(torch.bfloat16)
        assert torch.equal(param, want), name  # the moved weights arrived, rounded to bf16
    assert rollout.version == learner.version == 1


def test_trainer_says_which_precision_and_logs_the_mismatch(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    config = BASE.override({"run_dir": str(tmp_path / "run"), "env": "price", "steps": 1, "rollout.tasks_per_step": 2,
                            "rollout.max_turns": 1, "rollout.max_new_tokens": 5, "checkpoint_every": 0,
                            "learner_precision": "bfloat16", "placement.rollout_policy": "copy",
                            "placement.rollout_dtype": "float32", "finetune": "lora", "lora.rank": 4})  # fmt: skip
    console = Console(record=True, width=200)

    def score(step: int, trajectories: list[Trajectory]) -> None:
        for i, t in enumerate(trajectories):
            t.terms["synthetic"] = float(i % 3)

    train(config, policy=HFPolicy(copy.deepcopy(tiny[0]), tiny[1], device="cpu"), console=console, score_fn=score)
    text = console.export_text()
    assert "precision: learner bfloat16 autocast over fp32 master weights (as configured), rollout float32" in text
    row = read_metrics(config.run_dir)[-1]
    assert 0 < row["losses/mismatch_kl"] < 0.05 and row["losses/is_weight"] == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize(("flags", "expected"), [({"avx2"}, torch.float32), ({"avx2", "amx_bf16"}, torch.bfloat16)])
def test_weights_dtype_auto_loads_bf16_only_where_accelerated(
    tiny: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: set[str], expected: torch.dtype
) -> None:
    """``dtype = "auto"`` (the demo recipes' value): a CPU without AMX/AVX-512 BF16 emulates bf16 (an SFT step of
    the demo ran 22x slower), so the trainer loads float32 there and says why."""
    model_dir = tmp_path / "model"
    tiny[0].save_pretrained(model_dir)
    tiny[1].save_pretrained(model_dir)
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    console = Console(record=True, width=200)
    config = BASE.override({"run_dir": str(tmp_path / "run"), "model": str(model_dir), "dtype": "auto",
                            "device": "cpu", "env": "price", "finetune": "lora", "lora.rank": 4})  # fmt: skip
    from taskrl.training.trainer import Trainer

    trainer = Trainer(config, console=console)
    try:
        assert next(trainer.learner_policy.model.parameters()).dtype == expected
        name = str(expected).removeprefix("torch.")
        assert f"weights: {name} (auto: CPU " in console.export_text()
    finally:
        trainer.close()


def test_demo_recipes_choose_their_dtype_from_the_hardware() -> None:
    from taskrl.commands.demo import RL_RECIPE, SFT_RECIPE, load_recipe

    for recipe in (RL_RECIPE, SFT_RECIPE):
        assert config_from_dict(load_recipe(recipe)).dtype == "auto", recipe
    with pytest.raises(ConfigError, match="dtype must be one of float32, bfloat16, float16, auto"):
        config_from_dict({"dtype": "bf16"})
