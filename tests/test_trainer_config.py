"""TrainConfig: validation names the field, TOML + overrides, unknown keys, and every shipped recipe loads."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest

import taskrl.training.config as config_module
from taskrl.algos import ALGORITHMS
from taskrl.algos.ppo import PPOConfig
from taskrl.commands.demo import RL_RECIPE, SFT_RECIPE, load_recipe
from taskrl.training.config import (
    MOVED,
    ConfigError,
    TrainConfig,
    config_from_dict,
    dotted,
    field_docs,
    load_config,
    parse_overrides,
)
from taskrl.training.runs import check_resumable

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.toml"))


@pytest.mark.parametrize("name", ["TrainConfig", "RolloutSettings", "PlacementConfig", "LoraConfig"])
def test_every_field_has_a_docstring(name: str) -> None:
    (cls,) = ast.parse(inspect.getsource(getattr(config_module, name))).body
    assert isinstance(cls, ast.ClassDef)
    documented = {
        field.target.id
        for field, after in zip(cls.body, cls.body[1:], strict=False)
        if isinstance(field, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
    }
    assert {f.name for f in dataclasses.fields(getattr(config_module, name))} == documented


def test_every_algorithm_config_field_is_documented_in_help() -> None:
    keys = field_docs()
    for entry in ALGORITHMS.values():
        for f in dataclasses.fields(entry.config):
            assert f.name == "name" or f"algo.{f.name}" in keys, (entry.name, f.name)


@pytest.mark.parametrize(("old", "new"), [("temperature", "rollout.temperature"), ("algo", "algo.name"),
                                          ("clip_eps_high", "algo.clip_eps_high"), ("lora_rank", "lora.rank"),
                                          ("rollout_policy", "placement.rollout_policy"),
                                          ("kimi_tau", "algo.tau")])  # fmt: skip
def test_an_old_flat_key_fails_naming_its_new_place(old: str, new: str, tmp_path: Path) -> None:
    value = {"algo": "grpo", "lora_rank": 4, "rollout_policy": "copy"}.get(old, 0.5)
    with pytest.raises(ConfigError, match=f"{old} moved to {new}"):
        config_from_dict({old: value})
    with pytest.raises(ConfigError, match=f"{old} moved to {new}"):
        load_config(None, [f"{old}={value!r}".replace("'", '"')])
    (tmp_path / "old.toml").write_text(f"{old} = {value!r}\n".replace("'", '"'))
    with pytest.raises(ConfigError, match=f"{old} moved to {new}"):
        load_config(tmp_path / "old.toml")
    assert MOVED[old] == new


def test_sections_compose_from_tables_dotted_keys_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('placement.nproc = 1\n[algo]\nname = "ppo"\ngamma = 0.9\n[rollout]\ntemperature = 0.7\n'
                    'group_size = 1\n')  # fmt: skip
    config = load_config(path, ["rollout.temperature=0.5", "algo.vf_coef=1.0"])
    assert isinstance(config.algo, PPOConfig) and (config.algo.gamma, config.algo.vf_coef) == (0.9, 1.0)
    assert (config.rollout.temperature, config.rollout.group_size) == (0.5, 1)
    assert config_from_dict(config.to_dict()) == config  # what a run directory stores reads back
    with pytest.raises(ConfigError, match=r"algo.gamma \(a field of ppo\): not a field of algo.name='grpo'"):
        config_from_dict({"algo.gamma": 0.9})
    with pytest.raises(ConfigError, match="rollout.temprature .did you mean 'temperature'"):
        config_from_dict({"rollout.temprature": 0.9})
    with pytest.raises(ConfigError, match="lora.rank must be an integer >= 1"):
        config_from_dict({"lora": {"rank": 0}})
    with pytest.raises(ConfigError, match="placement.rollout_url must be the server's http"):
        config_from_dict({"placement.rollout_policy": "server"})


def test_an_old_run_dirs_flat_config_is_converted_once_on_resume(tmp_path: Path) -> None:
    """A run directory written before sections holds a flat config.json: resume compares it converted by MOVED,
    and a real difference still fails naming the dotted key."""
    config = config_from_dict({"run_dir": str(tmp_path), "rollout.temperature": 0.7, "algo.clip_eps_high": 0.28})
    flat = {k: v for k, v in dotted(config.to_dict()).items()}
    old = {key.rpartition(".")[2] if key.startswith(("rollout.", "placement.")) else key: value
           for key, value in flat.items()}  # fmt: skip
    old.update(algo="grpo", clip_eps_high=0.28, normalize_std=False, drop_zero_variance=True, clip_eps_low=0.2,
               gamma=1.0, kimi_tau=0.0, lora_rank=16, lora_alpha=32.0, lora_dropout=0.0,
               lora_targets=config.lora.targets)  # fmt: skip
    old = {k: v for k, v in old.items() if not k.startswith(("algo.", "lora."))}
    (tmp_path / "config.json").write_text(json.dumps(old))
    (tmp_path / "metrics.jsonl").write_text("")
    check_resumable(tmp_path, config, has_checkpoint=False)  # the same run: resumes
    changed = config_from_dict({"run_dir": str(tmp_path), "rollout.temperature": 0.9, "algo.clip_eps_high": 0.28})
    with pytest.raises(ConfigError, match="rollout.temperature: 0.7 -> 0.9"):
        check_resumable(tmp_path, changed, has_checkpoint=False)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"steps": 0}, "TrainConfig.steps must be an integer >= 1"),
        ({"algo.name": "dpo"}, "algo.name must be one of grpo, ppo, cispo, kimi, sft"),
        ({"kl": "k2"}, "TrainConfig.kl must be one of"),
        ({"kl": "k3_loss"}, "TrainConfig.kl_coef must be > 0"),
        ({"rollout.top_p": 1.5}, "rollout.top_p must be in (0, 1]"),
        ({"rollout.group_size": 1}, "rollout.group_size must be >= 2 for grpo"),
        ({"sft_warmup_steps": 200}, "TrainConfig.sft_warmup_steps must be <= steps"),
        ({"lr": {"kind": "nope"}}, "TrainConfig.lr: unknown schedule kind"),
        ({"reward_weights": {"format": {"kind": "linear"}}}, "TrainConfig.reward_weights.format: bad arguments"),
        ({"algo.clip_eps_low": -0.1}, "algo.clip_eps_low must be >= 0"),
        ({"algo.name": "kimi", "algo.alpha": 1.0}, "algo.alpha must be below algo.beta"),
        ({"dynamic_sampling": True, "algo.name": "ppo"},
         "TrainConfig.dynamic_sampling must be false for algo.name='ppo'"),
        ({"dynamic_sampling": True, "algo.drop_zero_variance": False},
         "algo.drop_zero_variance must be true with dynamic_sampling=true"),
        ({"dynamic_sampling": True, "placement.nproc": 2}, "placement.nproc must be 1 with dynamic_sampling=true"),
        ({"dynamic_sampling_max_rounds": -1}, "TrainConfig.dynamic_sampling_max_rounds must be an integer >= 0"),
        ({"overlong_filter": "yes"}, "TrainConfig.overlong_filter must be a boolean"),
    ],
)
def test_bad_values_fail_naming_the_field(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(changes)
    assert message in str(err.value)


def test_ppo_and_sft_do_not_need_groups() -> None:
    assert config_from_dict({"algo.name": "ppo", "rollout.group_size": 1}).phases == (0, 100)
    assert config_from_dict({"algo.name": "sft", "rollout.group_size": 1, "steps": 5}).phases == (5, 0)
    assert config_from_dict({"sft_warmup_steps": 3, "steps": 10}).phases == (3, 7)


def test_unknown_keys_and_wrong_types_fail_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="unknown config key\\(s\\): learning_rate"):
        config_from_dict({"learning_rate": 1e-4})
    with pytest.raises(ConfigError, match="TrainConfig.steps must be an integer"):
        config_from_dict({"steps": "ten"})
    with pytest.raises(ConfigError, match="TrainConfig.resume must be a boolean"):
        config_from_dict({"resume": 1})
    assert config_from_dict({"lr": 1, "entropy_coef": {"kind": "linear", "start": 0.01, "end": 0.001, "steps": 10}})


def test_toml_plus_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('env = "noop"\nsteps = 5\nlr = {kind = "cosine", start = 3e-5, end = 1e-6, steps = 5}\n')
    config = load_config(path, ["steps=7", "env=shop", 'lora.targets=["q_proj"]', "algo.normalize_std=true"])
    assert (config.env, config.steps, config.lora.targets, config.algo.normalize_std) == ("shop", 7, ["q_proj"], True)
    assert config.lr == {"kind": "cosine", "start": 3e-5, "end": 1e-6, "steps": 5}
    assert parse_overrides(["run_dir=runs/x", "kl_coef=0.1"]) == {"run_dir": "runs/x", "kl_coef": 0.1}
    with pytest.raises(ConfigError, match="not key=value"):
        parse_overrides(["steps"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("steps = [")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(tmp_path / "bad.toml")


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipes_load(recipe: Path) -> None:
    config = load_config(recipe)
    assert config.run_dir.startswith("runs/")


def test_the_demo_reads_its_settings_from_the_recipes() -> None:
    """`make demo` has no embedded copy: it loads recipes/demo_sft.toml and recipes/demo.toml (one source)."""
    recipes = Path(__file__).parent.parent / "recipes"
    assert (recipes / "demo_sft.toml", recipes / "demo.toml") == (SFT_RECIPE, RL_RECIPE)
    sft, rl = load_config(SFT_RECIPE), load_config(RL_RECIPE)
    assert load_recipe(RL_RECIPE)["lr"] == rl.lr and (sft.algo.name, rl.algo.name) == ("sft", "grpo")
    assert sft.env == rl.env == "prices" and sft.env_kwargs["max_items"] < rl.env_kwargs["min_items"]


def test_an_unknown_split_fails_naming_the_splits() -> None:
    """Issue 38 item 10: 'valid' used to pass and read as a training split of the built-in envs."""
    for field in ("split", "eval_split"):
        with pytest.raises(ConfigError, match=rf"TrainConfig.{field} must be one of train, val, test, all, got .valid"):
            load_config(None, [f"{field}=valid"])


def test_the_plan_says_what_a_run_will_do() -> None:
    """Issue 38 item 10: `taskrl train` prints this line before anything loads, with or without a config."""
    assert TrainConfig().plan() == (
        "train env 'shop' on model 'smollm2' (lora): 100 steps (100 grpo), 8 tasks x 8 samples per step, "
        "split 'train', seed 0 -> runs/train"
    )
    plan = load_config(None, ["steps=6", "sft_warmup_steps=2", "algo.name=\"cispo\""]).plan()
    assert "6 steps (2 SFT (expert) + 4 cispo)" in plan
