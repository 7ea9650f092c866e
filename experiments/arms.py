"""The arms of the control ladder as reusable functions (issue 40): matched configs, a time-limited training loop
that records each arm's budget, the held-out evaluation, and model loading from a directory or a GGUF file.

    rl = grpo_config(base, lr=2e-5, tasks_per_step=8, group_size=8)
    rft = rft_config(rl, min_reward=1.0, lr=1e-4)   # same prompts and K samples per prompt; SFT on the successes
    trainer, budget = train_arm(rft, minutes=30)    # budget: steps, episodes, tokens, kept successes, seconds
    result = held_out(trainer, make_env, tasks, samples=16, temperature=1.0, max_new_tokens=64)

RFT (rejection-sampling fine-tuning) is ``algo="sft"`` with ``sft_data="policy"``: each step samples
``group_size`` episodes of each of ``tasks_per_step`` prompts with the current policy, keeps those whose reward is
``>= min_reward`` (``keep="best"``: only each prompt's best sample, when above its group's mean) and trains on
their sampled tokens. With the RL arm's seed and task settings the task sampler
draws the very same prompts in the same order, so the two arms see the same prompts and sample as many episodes
per step; ``train_arm`` records the episodes and tokens each actually sampled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MATCHED_FIELDS = ("seed", "env", "env_kwargs", "split", "rollout.tasks_per_step", "rollout.group_size",
                  "rollout.temperature", "rollout.top_p", "rollout.max_turns", "rollout.max_new_tokens",
                  "rollout.max_context_tokens", "steps", "overlong_filter")  # fmt: skip
"""Fields an RFT arm takes unchanged from its RL arm: the prompts drawn and the episodes sampled per step, and
which episodes are left out (``overlong_filter``: RFT then clones no success a token cap ended)."""
_RL_ONLY = ("dynamic_sampling", "dynamic_sampling_max_rounds", "entropy_coef", "kl", "kl_coef",
            "sft_warmup_steps")  # fmt: skip
"""Fields of the RL arm an RFT arm drops, with every ``algo.*`` field (the RL algorithm's own settings)."""


def grpo_config(base: dict[str, Any], *, lr: float, tasks_per_step: int, group_size: int,
                **options: Any) -> dict[str, Any]:  # fmt: skip
    """A GRPO arm: ``base`` (model, env, episode limits, seed ...) plus the RL fields and any options
    (``normalize_std``, ``overlong_filter``, ``dynamic_sampling`` ...)."""
    return {
        **base,
        "algo.name": "grpo",
        "lr": lr,
        "rollout.tasks_per_step": tasks_per_step,
        "rollout.group_size": group_size,
        **options,
    }


def rft_config(rl: dict[str, Any], *, min_reward: float, lr: float | None = None, keep: str = "all") -> dict[str, Any]:
    """The RFT arm matched to the RL arm ``rl``: the same ``MATCHED_FIELDS`` (so the same prompts in the same order
    and ``group_size`` samples of each), SFT on the samples whose reward is ``>= min_reward``, at ``lr`` (default
    the RL arm's). A dynamic-sampling RL arm samples more episodes than this: compare the recorded budgets."""
    out = {k: v for k, v in rl.items() if k not in _RL_ONLY and not k.startswith("algo.")}
    out.update({"algo.name": "sft", "sft_data": "policy", "sft_min_reward": float(min_reward), "sft_keep": keep,
                "lr": lr if lr is not None else rl["lr"]})
    return out


def sft_config(base: dict[str, Any], *, lr: float, tasks_per_step: int) -> dict[str, Any]:
    """An SFT arm on the env's expert demonstrations (``scripted_rule``, one episode per prompt)."""
    return {
        **base,
        "algo.name": "sft",
        "sft_data": "expert",
        "lr": lr,
        "rollout.tasks_per_step": tasks_per_step,
        "rollout.group_size": 1,
    }


def budget_of(rows: Sequence[dict[str, Any]], train_s: float, *, time_limited: bool) -> dict[str, Any]:
    """What an arm spent: steps, episodes and sampled tokens played, trajectories trained on (RFT: the kept
    successes), wall seconds of training, and whether the time limit (not the step count) stopped it."""
    total = lambda key: float(sum(r.get(key) or 0.0 for r in rows))  # noqa: E731
    return {"steps": len(rows), "episodes": total("charts/episodes"), "sampled_tokens": total("charts/sampled_tokens"),
            "trained_trajectories": total("charts/trained_trajectories"),
            "trained_tokens": total("charts/trained_tokens"), "train_s": train_s,
            "time_limited": time_limited}  # fmt: skip


def train_arm(config: dict[str, Any], *, minutes: float, policy: Any = None, env_factory: Any = None,
              on_step: Callable[[int, dict[str, Any]], None] | None = None) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """Train ``config`` one step at a time until ``config["steps"]`` or ``minutes`` of training wall-clock, never
    starting a step the last one's duration says would end past the limit. Returns the open ``Trainer`` (close it)
    and the arm's budget (``budget_of``) with the per-step rewards."""
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    cfg = config_from_dict(dict(config))
    trainer = Trainer(cfg, policy=policy, env_factory=env_factory)
    rows: list[dict[str, Any]] = []
    elapsed, last, limit = 0.0, 0.0, minutes * 60
    try:
        trainer.train(until=0)  # resume from a checkpoint, if any
        while (trainer.completed or 0) < cfg.steps and elapsed + last <= limit:
            began = time.monotonic()
            (metrics,) = trainer.train(until=(trainer.completed or 0) + 1)
            last = time.monotonic() - began
            elapsed += last
            rows.append(metrics)
            if on_step is not None:
                on_step(trainer.completed or 0, metrics)
    except BaseException:
        trainer.close()
        raise
    budget = budget_of(rows, elapsed, time_limited=(trainer.completed or 0) < cfg.steps)
    budget["rewards"] = [r.get("rewards/total") for r in rows]
    return trainer, budget


def held_out(trainer: Any, env_factory: Callable[[], Any], tasks: Sequence[Any], *, samples: int,
             temperature: float, max_new_tokens: int, max_turns: int = 1, success_threshold: float = 1.0,
             pass_ks: Sequence[int] = (1,), seed: int = 0, name: str = "heldout") -> dict[str, Any]:  # fmt: skip
    """``taskrl.eval`` of the trainer's current weights on ``tasks``: mean reward and success over tasks (bootstrap
    CIs), pass@k, and the success count with Wilson and exact intervals over episodes."""
    from experiments.stats import proportion
    from taskrl.eval import EvalConfig, evaluate

    config = EvalConfig(samples_per_task=samples, temperature=temperature, max_turns=max_turns,
                        max_new_tokens=max_new_tokens, success_threshold=success_threshold,
                        pass_ks=tuple(k for k in pass_ks if k <= samples), concurrency=64, seed=seed)  # fmt: skip
    job = evaluate(env_factory, {"policy": trainer.learner_policy}, tasks, config, run_log=trainer.run, name=name)
    result = trainer.rollouts.run(job)
    stats = result["policies"]["policy"]
    successes = sum(row["policies"]["policy"]["successes"] for row in result["per_task"])
    episodes = sum(row["policies"]["policy"]["n"] for row in result["per_task"])
    out = {key: stats[key] for key in stats if key == "mean_reward" or key == "success_rate" or key.startswith("pass@")}
    out.update(tasks=result["tasks"], samples_per_task=samples, temperature=temperature,
               successes=proportion(successes, episodes),
               per_task_reward=[row["policies"]["policy"]["mean_reward"] for row in result["per_task"]])  # fmt: skip
    return out


def model_dir(path: str | Path, cache: Path) -> str:
    """A model directory for ``TrainConfig.model``: ``smollm2``, a ``save_pretrained`` directory as is, or a GGUF
    file dequantised once into ``cache`` (a Llama-architecture GGUF such as SmolLM2's)."""
    if str(path) == "smollm2":
        return "smollm2"
    source = Path(path).expanduser()
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise SystemExit(f"--model-path {source}: a directory needs the config.json of save_pretrained")
        return str(source)
    if source.suffix != ".gguf" or not source.is_file():
        raise SystemExit(f"--model-path {source}: expected a save_pretrained directory or a .gguf file")
    out = cache / f"{source.stem}-dequantised"
    if (out / "config.json").is_file():
        return str(out)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    quantised = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                     dtype=torch.float32, local_files_only=True)  # fmt: skip
    settings = quantised.config.to_dict()
    settings.pop("quantization_config", None)  # its weights are dequantised; the leftover config breaks saving
    fresh = LlamaForCausalLM(LlamaConfig.from_dict(settings))
    fresh.load_state_dict(quantised.state_dict(), strict=True)
    partial = out.with_name(out.name + ".partial")
    fresh.save_pretrained(str(partial))
    AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name,
                                  local_files_only=True).save_pretrained(str(partial))  # fmt: skip
    partial.rename(out)
    return str(out)
