"""TrainConfig: validation names the field, TOML + overrides, unknown keys, and every shipped recipe loads."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from taskrl.commands.demo import RL_RECIPE, SFT_RECIPE, load_recipe
from taskrl.training.config import ConfigError, TrainConfig, config_from_dict, load_config, parse_overrides

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.toml"))


def test_every_field_has_a_docstring() -> None:
    source = Path(__file__).parent.parent.joinpath("taskrl/training/config.py").read_text()
    (cls,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "TrainConfig"]
    documented = {
        field.target.id
        for field, after in zip(cls.body, cls.body[1:], strict=False)
        if isinstance(field, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
    }
    assert {f.name for f in dataclasses.fields(TrainConfig)} == documented


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"steps": 0}, "TrainConfig.steps must be an integer >= 1"),
        ({"algo": "dpo"}, "TrainConfig.algo must be one of grpo, ppo, cispo, kimi, sft"),
        ({"kl": "k2"}, "TrainConfig.kl must be one of"),
        ({"kl": "k3_loss"}, "TrainConfig.kl_coef must be > 0"),
        ({"top_p": 1.5}, "TrainConfig.top_p must be in (0, 1]"),
        ({"group_size": 1}, "TrainConfig.group_size must be >= 2 for grpo"),
        ({"sft_warmup_steps": 200}, "TrainConfig.sft_warmup_steps must be <= steps"),
        ({"lr": {"kind": "nope"}}, "TrainConfig.lr: unknown schedule kind"),
        ({"reward_weights": {"format": {"kind": "linear"}}}, "TrainConfig.reward_weights.format: bad arguments"),
        ({"clip_eps_low": -0.1}, "TrainConfig.clip_eps_low must be >= 0"),
        ({"kimi_alpha": 1.0}, "TrainConfig.kimi_alpha must be below kimi_beta"),
        ({"dynamic_sampling": True, "algo": "ppo"}, "TrainConfig.dynamic_sampling must be false for algo='ppo'"),
        ({"dynamic_sampling": True, "drop_zero_variance": False},
         "TrainConfig.drop_zero_variance must be true with dynamic_sampling=true"),
        ({"dynamic_sampling": True, "nproc": 2}, "TrainConfig.nproc must be 1 with dynamic_sampling=true"),
        ({"dynamic_sampling_max_rounds": -1}, "TrainConfig.dynamic_sampling_max_rounds must be an integer >= 0"),
        ({"overlong_filter": "yes"}, "TrainConfig.overlong_filter must be a boolean"),
    ],
)
def test_bad_values_fail_naming_the_field(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(changes)
    assert message in str(err.value)


def test_ppo_and_sft_do_not_need_groups() -> None:
    assert TrainConfig(algo="ppo", group_size=1).phases == (0, 100)
    assert TrainConfig(algo="sft", group_size=1, steps=5).phases == (5, 0)
    assert TrainConfig(sft_warmup_steps=3, steps=10).phases == (3, 7)


def test_unknown_keys_and_wrong_types_fail_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="unknown TrainConfig field\\(s\\): learning_rate"):
        config_from_dict({"learning_rate": 1e-4})
    with pytest.raises(ConfigError, match="TrainConfig.steps must be an integer"):
        config_from_dict({"steps": "ten"})
    with pytest.raises(ConfigError, match="TrainConfig.resume must be a boolean"):
        config_from_dict({"resume": 1})
    assert config_from_dict({"lr": 1, "entropy_coef": {"kind": "linear", "start": 0.01, "end": 0.001, "steps": 10}})


def test_toml_plus_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('env = "noop"\nsteps = 5\nlr = {kind = "cosine", start = 3e-5, end = 1e-6, steps = 5}\n')
    config = load_config(path, ["steps=7", "env=shop", 'lora_targets=["q_proj"]', "normalize_std=true"])
    assert (config.env, config.steps, config.lora_targets, config.normalize_std) == ("shop", 7, ["q_proj"], True)
    assert config.lr == {"kind": "cosine", "start": 3e-5, "end": 1e-6, "steps": 5}
    assert parse_overrides(["run_dir=runs/x", "kl_coef=0.1"]) == {"run_dir": "runs/x", "kl_coef": 0.1}
    with pytest.raises(ConfigError, match="not field=value"):
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
    assert load_recipe(RL_RECIPE)["lr"] == rl.lr and (sft.algo, rl.algo) == ("sft", "grpo")
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
    plan = load_config(None, ["steps=6", "sft_warmup_steps=2", "algo=\"cispo\""]).plan()
    assert "6 steps (2 SFT (expert) + 4 cispo)" in plan
