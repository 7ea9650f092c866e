"""A trained run directory is a model: its LoRA adapter records a base that loads offline, is merged onto it by
``HFPolicy.from_pretrained`` (eval, serve, rollout, and ``train``'s ``model``), and a missing base is one clear
error naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from taskrl.policies import PolicyError, make_policy
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.training.config import load_config
from taskrl.training.trainer import train

CONFIG = [
    'env="price"', 'algo.name="sft"', 'sft_data="expert"', "steps=1", "sft_lr=0.05", "lr=0.05", "lora.rank=4",
    "rollout.tasks_per_step=2", "rollout.group_size=1", "rollout.max_turns=3",
    "rollout.max_new_tokens=40", "progress=false",
]  # fmt: skip


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([[1, 2, 3, 4, 5]])).logits


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("trained")
    base = root / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(base))
    tokenizer.save_pretrained(str(base))
    run = root / "run"
    train(load_config(None, [*CONFIG, f'model="{base}"', f'run_dir="{run}"']))
    return base, run


def test_the_adapter_records_its_base_and_loads_merged_from_the_policy_or_run_dir(trained: tuple[Path, Path]) -> None:
    from peft import PeftModel

    base, run = trained
    adapter = run / "policy"
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    expected = PeftModel.from_pretrained(tiny_model(seed=0)[0], str(adapter)).merge_and_unload()
    for path in (adapter, run):  # the adapter itself, or the run directory that holds it
        policy = make_policy("hf", model=str(path), device="cpu")
        try:
            assert isinstance(policy, HFPolicy) and policy.name == "run/policy"
            assert torch.allclose(_logits(policy.model), _logits(expected), atol=1e-5)
        finally:
            policy.close()
    assert not torch.allclose(_logits(expected), _logits(tiny_model(seed=0)[0]), atol=1e-4), "training changed it"


def test_training_from_a_trained_adapter_stacks_on_it(trained: tuple[Path, Path], tmp_path: Path) -> None:
    _, run = trained
    second = tmp_path / "second"
    train(load_config(None, [*CONFIG, f'model="{run / "policy"}"', f'run_dir="{second}"']))
    recorded = json.loads((second / "policy" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str(run / "policy")
    HFPolicy.from_pretrained(second, device="cpu").close()


def test_a_missing_base_or_no_model_is_one_clear_error(trained: tuple[Path, Path], tmp_path: Path) -> None:
    _, run = trained
    moved = tmp_path / "adapter"
    shutil.copytree(run / "policy", moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(PolicyError, match=r"trained on base model '.*gone', which is not on this machine"):
        HFPolicy.from_pretrained(moved, device="cpu")
    config["base_model_name_or_path"] = None
    (moved / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(PolicyError, match="does not record its base model"):
        HFPolicy.from_pretrained(moved, device="cpu")
    with pytest.raises(PolicyError, match="adapter_config.json"):
        HFPolicy.from_pretrained(tmp_path / "empty", device="cpu")
