"""The training loop: collect -> score -> advantages -> update -> sync weights -> log -> checkpoint.

    from taskrl.trainer import Trainer
    from taskrl.training.config import load_config
    Trainer(load_config("recipes/grpo_smollm2_lora.toml", ["steps=20"])).train()

Each step is four separable parts: ``collect`` (the agent loop; knows nothing of the algorithm), ``score``
(extra reward terms, scheduled weights, group terms), ``Learner.update`` (callable on any trajectories) and
``weight_sync`` (a no-op version bump when the rollout policy holds the learner's model). A run directory is
resumed from its last checkpoint when rerun with the same config: same tasks, same seeds, same samples.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from taskrl.algos.schedules import make_schedule
from taskrl.env import Env, make, maybe_await
from taskrl.eval import EvalConfig, evaluate
from taskrl.monitor import Monitors
from taskrl.policies.base import Policy, SamplingParams
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards import set_training_step
from taskrl.rollout import RolloutConfig, derive_seed, run_episodes
from taskrl.runlog import RunLog
from taskrl.training.checkpoint import load_checkpoint, save_checkpoint
from taskrl.training.config import ConfigError, TrainConfig
from taskrl.training.data import EpochSampler, TrajectoryFile
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.training.runs import check_resumable, latest_checkpoint, rewind_run_dir
from taskrl.types import Trajectory

INVALID_CALL_CAP = "invalid_tool_call_cap"

ScoreFn = Callable[[int, list[Trajectory]], None]
"""Extra scoring after the env's reward: ``fn(step, trajectories)`` edits ``trajectory.rewards`` in place
(token-level rewards, reward models, ``taskrl.monitor.shape_rewards``)."""


class WeightSync(Protocol):
    """Makes the rollout policy sample from the learner's weights at ``version`` (later samples carry it)."""

    def __call__(self, version: int) -> None: ...


class InProcessSync:
    """The rollout policy holds the learner's model object: nothing to copy, only the version to bump."""

    def __init__(self, policy: Any, model: Any) -> None:
        if getattr(policy, "model", None) is not model:
            raise ValueError(
                "the rollout policy does not hold the learner's model; pass a weight_sync that pushes weights "
                "to it (e.g. LoRA adapters to a server)"
            )
        self.policy = policy

    def __call__(self, version: int) -> None:
        self.policy.version = version


class Trainer:
    """One training run; see the module docstring. Optional parts are plain callables/objects."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        policy: Policy | None = None,
        env_factory: Callable[[], Env] | None = None,
        task_sampler: Any = None,
        score_fn: ScoreFn | None = None,
        monitors: Monitors | None = None,
        weight_sync: WeightSync | None = None,
        console: Console | None = None,
    ) -> None:
        """``policy`` defaults to ``HFPolicy.from_pretrained(config.model)``; ``env_factory`` to ``make(config.env)``;
        ``task_sampler`` (``sample(step, n, rng)``, ``update``, ``metrics``, ``state_dict``) to ``EpochSampler``."""
        self.config = cfg = config
        self.console = console or Console()
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        torch.manual_seed(cfg.seed)  # LoRA and value-head initialisation
        # The env first: a wrong env name or split fails before the model is loaded.
        self.env_factory = env_factory or (lambda: make(cfg.env, **cfg.env_kwargs))
        # One env kept for the run: tasks, the expert rule, and group scoring (``finalize_group``).
        self.probe = probe = self.env_factory()
        self.failure_reward = float(getattr(probe, "failure_reward", 0.0))
        tasks = list(probe.tasks(cfg.split))
        if not tasks:
            raise ConfigError(f"TrainConfig.split: env '{cfg.env}' has no tasks in split '{cfg.split}'")
        rule = getattr(probe, "scripted_rule", None)
        if cfg.phases[0] and cfg.sft_data == "expert" and rule is None:
            raise ConfigError(
                f"TrainConfig.sft_data='expert' needs env '{cfg.env}' to define scripted_rule; "
                "use sft_data='policy' or a trajectories JSONL"
            )
        from_file = cfg.phases[0] and cfg.sft_data not in ("expert", "policy")
        self.sft_file = TrajectoryFile(cfg.sft_data, cfg.seed) if from_file else None
        self.tasks_by_id = {t.id: t for t in tasks}
        self.sampler = task_sampler if task_sampler is not None else EpochSampler(tasks, cfg.seed)
        self.score_fn = score_fn
        self.monitors = monitors if monitors is not None else Monitors(tool_names=probe.tools.names)
        self.reward_weights = {
            term: make_schedule(spec, field=f"TrainConfig.reward_weights.{term}")
            for term, spec in cfg.reward_weights.items()
        }
        self.run = RunLog(cfg.run_dir, backends=cfg.log_backends)
        self._owns_policy = policy is None
        if policy is None:
            from taskrl.policies.hf import HFPolicy

            dtype = getattr(torch, cfg.dtype)
            policy = HFPolicy.from_pretrained(cfg.model, device=cfg.device, dtype=dtype)
        self.policy: Any = policy
        policy.model = prepare_model(policy.model, cfg)
        tokenizer = policy.chat_format.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.learner = Learner(policy.model, cfg, pad_id=int(pad or 0))
        self.weight_sync = weight_sync or InProcessSync(policy, policy.model)
        use_expert = cfg.phases[0] and cfg.sft_data == "expert"
        self.expert = ScriptedPolicy(rule, name="expert", chat_format=policy.chat_format) if use_expert else None
        self.completed: int | None = None  # steps done once ``train`` has resumed; None before

    # -- the four parts of a step ------------------------------------------------------------------
    def is_sft_step(self, step: int) -> bool:
        return step < self.config.phases[0]

    def env_factory_at(self, step: int, epoch: int) -> Callable[[], Env]:
        """Envs for this step: each is told ``set_step(step, epoch)``, and so is every reward object it holds."""

        def factory() -> Env:
            env = self.env_factory()
            for target in _step_hooks(env, "set_step"):
                target(step, epoch)
            return env

        return factory

    def collect(self, step: int) -> list[Trajectory]:
        """Play this step's episodes (the expert's or a JSONL's in SFT warm-up steps) and add group terms."""
        cfg = self.config
        epoch = int(getattr(self.sampler, "epoch", 0))
        set_training_step(step, epoch)
        sft_step = self.is_sft_step(step)
        if sft_step and self.sft_file is not None:
            return self.sft_file.take(cfg.tasks_per_step * cfg.group_size)
        tasks = self.sampler.sample(step, cfg.tasks_per_step, random.Random(derive_seed(cfg.seed, "tasks", step)))
        expert = sft_step and self.expert is not None
        rollout = RolloutConfig(
            max_turns=cfg.max_turns,
            max_context_tokens=cfg.max_context_tokens,
            sampling=SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p),
            group_size=1 if expert else cfg.group_size,  # a deterministic expert's K samples would be identical
            concurrency=cfg.concurrency,
            seed=derive_seed(cfg.seed, "rollout", step),
        )
        factory = self.env_factory_at(step, epoch)
        policy = self.expert if expert else self.policy
        trajectories = asyncio.run(run_episodes(factory, policy, tasks, rollout))
        for hook in _step_hooks(self.probe, "set_step"):
            hook(step, epoch)
        finalizers = _step_hooks(self.probe, "finalize_group") if rollout.group_size > 1 else []
        if finalizers:
            for group in _groups(trajectories).values():
                task = self.tasks_by_id.get(group[0].task_id)
                for finalize in finalizers:
                    finalize(group, task)
        return trajectories

    def score(self, step: int, trajectories: list[Trajectory]) -> None:
        """Extra terms (``score_fn``), scheduled term weights, then the invalid-call cap on the new total."""
        if self.score_fn is not None:
            self.score_fn(step, trajectories)
        weights = {term: float(schedule(step)) for term, schedule in self.reward_weights.items()}
        for traj in trajectories:
            for term, weight in weights.items():
                if traj.rewards.get(term) is not None:
                    traj.rewards[term] = weight * traj.rewards[term]  # type: ignore[operator]
            traj.rewards.pop(INVALID_CALL_CAP, None)
            if traj.metrics.get("invalid_tool_calls", 0) > 0 and traj.reward > self.failure_reward:
                traj.rewards[INVALID_CALL_CAP] = self.failure_reward - traj.reward

    def train_step(self, step: int) -> dict[str, Any]:
        """Collect, score, update, sync, log one step; returns its metrics (also appended to metrics.jsonl)."""
        cfg = self.config
        sft_step = self.is_sft_step(step)
        start = time.perf_counter()
        trajectories = self.collect(step)
        collected = time.perf_counter()
        self.score(step, trajectories)
        for task_id, group in _groups(trajectories, by="task_id").items():
            if task_id in self.tasks_by_id:
                self.sampler.update(task_id, [t.reward for t in group])
        metrics = self.learner.update(trajectories, step=step, sft_mode=sft_step)
        updated = time.perf_counter()
        self.weight_sync(self.learner.version)
        metrics.update(_batch_metrics(trajectories))
        monitor_metrics, alerts = self.monitors.check(step + 1, trajectories)
        metrics.update(monitor_metrics)
        for alert in alerts:
            self.run.alert(alert.step, alert.monitor, alert.value, alert.threshold, alert.message)
        metrics.update(self.sampler.metrics() if hasattr(self.sampler, "metrics") else {})
        sampled = sum(t.num_sampled_tokens for t in trajectories)
        metrics.update({
            "charts/phase": "sft" if sft_step else cfg.algo,
            "charts/step_time_s": updated - start,
            "charts/rollout_time_s": collected - start,
            "charts/update_time_s": updated - collected,
            "charts/tokens_per_s": sampled / max(updated - start, 1e-9),
            "charts/update_tokens_per_s": metrics.get("charts/trained_tokens", 0.0) / max(updated - collected, 1e-9),
        })  # fmt: skip
        if cfg.log_trajectories:
            self.run.write_trajectories(step + 1, trajectories)
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            metrics.update(_eval_metrics(self.evaluate(step + 1)))
        self.run.log(step + 1, metrics)
        return metrics

    def evaluate(self, step: int, name: str | None = None) -> dict[str, Any]:
        """Greedy episodes on ``eval_split``: ``taskrl.eval`` results, also written to run_dir/eval/NAME.json."""
        cfg = self.config
        tasks = list(self.env_factory().tasks(cfg.eval_split))[: cfg.eval_tasks]
        config = EvalConfig(
            samples_per_task=1,
            temperature=0.0,
            max_turns=cfg.max_turns,
            max_context_tokens=cfg.max_context_tokens,
            max_new_tokens=cfg.max_new_tokens,
            concurrency=cfg.concurrency,
            seed=cfg.seed,
        )
        name = name or f"step_{step:06d}"
        return asyncio.run(
            evaluate(self.env_factory, {"policy": self.policy}, tasks, config, run_log=self.run, name=name, step=step)
        )

    # -- the run -----------------------------------------------------------------------------------
    def resume(self) -> int:
        """Load the run directory's latest checkpoint if any; return the number of completed steps."""
        cfg = self.config
        checkpoint = latest_checkpoint(cfg.run_dir)
        check_resumable(self.run.dir, cfg, has_checkpoint=checkpoint is not None)
        if checkpoint is None:
            rewind_run_dir(self.run.dir, 0)  # a run killed before its first checkpoint starts over
            return 0
        state = load_checkpoint(checkpoint, self.learner)
        self.sampler.load_state_dict(state["sampler"])
        if self.sft_file is not None:
            self.sft_file.load_state_dict(state["sft_file"])
        self.weight_sync(self.learner.version)
        rewind_run_dir(self.run.dir, int(state["step"]))
        self.console.print(f"resuming {cfg.run_dir} from {checkpoint.name} (policy version {self.learner.version})")
        return int(state["step"])

    def checkpoint(self, completed: int) -> Path:
        state: dict[str, Any] = {"sampler": self.sampler.state_dict()}
        if self.sft_file is not None:
            state["sft_file"] = self.sft_file.state_dict()
        return save_checkpoint(self.run.dir, completed, self.learner, state, keep=self.config.keep_checkpoints)

    def train(self, until: int | None = None) -> list[dict[str, Any]]:
        """Run (resuming on the first call) up to step ``until`` (default: all ``config.steps``).

        Returns the metrics of the steps run by this call; the policy is exported to run_dir/policy at the end.
        """
        cfg = self.config
        if self.completed is None:
            self.completed = self.resume()
            self.run.write_config(cfg)
        end = cfg.steps if until is None else min(until, cfg.steps)
        rows: list[dict[str, Any]] = []
        with self._progress() as bar:
            job = bar.add_task("training", total=end, completed=self.completed, reward=float("nan"))
            for step in range(self.completed, end):
                metrics = self.train_step(step)
                rows.append(metrics)
                self.completed = step + 1
                if self.completed == cfg.steps or (cfg.checkpoint_every and self.completed % cfg.checkpoint_every == 0):
                    self.checkpoint(self.completed)
                bar.update(job, advance=1, reward=metrics.get("rewards/total", float("nan")))
                if bar.disable:
                    self.console.print(_step_line(self.completed, cfg.steps, metrics), highlight=False, markup=False)
        if self.completed == cfg.steps and (rows or not (self.run.dir / "policy").exists()):
            self.export(self.run.dir / "policy")
        return rows

    def export(self, path: Path) -> Path:
        """Save the trained policy: the LoRA adapter or the full model, with the tokenizer."""
        self.policy.model.save_pretrained(str(path))
        self.policy.chat_format.tokenizer.save_pretrained(str(path))
        return path

    def close(self) -> None:
        self.run.close()
        close_env = getattr(self.probe, "close", None)
        if close_env is not None:
            asyncio.run(maybe_await(close_env()))
        if self._owns_policy:
            self.policy.close()

    def _progress(self) -> Progress:
        columns = (
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]:.3f}"), TimeElapsedColumn(), TextColumn("eta"),
            TimeRemainingColumn(),
        )  # fmt: skip
        return Progress(*columns, console=self.console, disable=not (self.config.progress and self.console.is_terminal))


def train(config: TrainConfig, **kwargs: Any) -> list[dict[str, Any]]:
    """Build a Trainer, run it to the end, close it; returns the metrics of the steps it ran."""
    trainer = Trainer(config, **kwargs)
    try:
        return trainer.train()
    finally:
        trainer.close()


# -- helpers ---------------------------------------------------------------------------------------
def _step_hooks(env: Any, name: str) -> list[Callable[..., Any]]:
    """``env.<name>`` and ``<name>`` of every object the env holds (its reward, its reward's terms)."""
    hooks = []
    for target in [env, *vars(env).values()] if hasattr(env, "__dict__") else [env]:
        hook = getattr(target, name, None)
        if callable(hook) and not isinstance(target, type):
            hooks.append(hook)
    return hooks


def _groups(trajectories: Sequence[Trajectory], by: str = "group_id") -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        key = getattr(t, by)
        out[key if key is not None else t.id].append(t)
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _batch_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``rewards/*`` (total, std, each term) and ``tools/*`` per episode, and episode ends."""
    rewards = [t.reward for t in trajectories]
    mean = _mean(rewards)
    out = {
        "rewards/total": mean,
        "rewards/std": math.sqrt(_mean([(r - mean) ** 2 for r in rewards])) if rewards else float("nan"),
        "charts/episodes": float(len(trajectories)),
        "charts/sampled_tokens": float(sum(t.num_sampled_tokens for t in trajectories)),
        "charts/terminated": _mean([float(t.terminated) for t in trajectories]),
        "charts/truncated": _mean([float(t.truncated) for t in trajectories]),
        "charts/errors": float(sum(t.error is not None for t in trajectories)),
    }
    for term in sorted({k for t in trajectories for k in t.rewards}):
        values = [t.rewards[term] for t in trajectories if t.rewards.get(term) is not None]
        out[f"rewards/{term}"] = _mean(values)  # type: ignore[arg-type]
    for name in ("tool_calls", "invalid_tool_calls", "tool_errors", "tool_cost", "turns"):
        out[f"tools/{name}"] = _mean([t.metrics.get(name, 0.0) for t in trajectories])
    return out


def _eval_metrics(result: dict[str, Any]) -> dict[str, float]:
    stats = result["policies"]["policy"]
    return {
        "eval/mean_reward": stats["mean_reward"]["value"],
        "eval/success_rate": stats["success_rate"]["value"],
        "eval/tool_calls": stats["tool_calls"],
        "eval/invalid_tool_calls": stats["invalid_tool_calls"],
    }


def _step_line(completed: int, total: int, metrics: dict[str, Any]) -> str:
    def show(key: str) -> str:
        value = metrics.get(key)
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"

    return (
        f"step {completed}/{total} [{metrics.get('charts/phase')}] reward {show('rewards/total')} "
        f"loss {show('losses/policy_loss') if 'losses/policy_loss' in metrics else show('losses/sft_nll')} "
        f"tool_calls {show('tools/tool_calls')} time {show('charts/step_time_s')}s"
    )
