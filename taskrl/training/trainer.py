"""The training loop: collect -> score -> advantages -> update -> sync weights -> log -> checkpoint.

    from taskrl.training.trainer import Trainer
    from taskrl.training.config import load_config
    Trainer(load_config("recipes/grpo_smollm2_lora.toml", ["steps=20"])).train()

Each step is four separable parts: ``collect`` (the agent loop; knows nothing of the algorithm), ``score``
(extra reward terms, scheduled weights, group terms), ``Learner.update`` (callable on any trajectories) and
``weight_sync`` (``taskrl.training.sync``: a version bump when the rollout policy holds the learner's model, a
copy into a separate rollout model, or a LoRA push to a server). A run directory is resumed from its last
checkpoint when rerun with the same config: same tasks, same seeds, same samples. Rollouts play on the run's
own event-loop thread; with ``async_rollout`` the next step's episodes play while the learner updates.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import random
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from taskrl import context
from taskrl.algos.schedules import make_schedule
from taskrl.distributed.ddp import DataParallel
from taskrl.env import Env
from taskrl.env_spec import EnvSpec, read_spec
from taskrl.eval import EvalConfig, evaluate
from taskrl.monitor import Monitors
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.policies.models import record_base_model
from taskrl.policies.openai import OpenAIPolicy
from taskrl.policies.precision import resolve, weights_dtype
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, error_note, run_episodes
from taskrl.runlog import RunLog
from taskrl.scoring import Clock, batch_metrics, score_collected
from taskrl.seeding import derive_seed
from taskrl.task_files import build_env, load_tasks
from taskrl.training.checkpoint import check_finite, load_checkpoint, save_checkpoint
from taskrl.training.config import ConfigError, TrainConfig
from taskrl.training.data import EpochSampler, TaskSampler, TrajectoryFile
from taskrl.training.filters import check_infra_failures, fill_batch
from taskrl.training.learner import NONFINITE_ALERT, Learner
from taskrl.training.model import prepare_model
from taskrl.training.overlap import RolloutLoop
from taskrl.training.runs import check_resumable, latest_checkpoint, rewind_run_dir
from taskrl.training.step_log import eval_metrics, staleness_metrics, step_line
from taskrl.training.sync import InProcessSync as InProcessSync  # re-exported: taskrl.training.trainer.InProcessSync
from taskrl.training.sync import WeightSync, WeightSyncError, connect_server, rollout_copy, rollout_setup
from taskrl.types import Task, Trajectory

if TYPE_CHECKING:
    from taskrl.policies.vllm_server import VLLMServer
    from taskrl.training.vllm_rollout import VLLMEngine

ScoreFn = Callable[[int, list[Trajectory]], None]
"""Extra measurements after the env's: ``fn(step, trajectories)`` adds terms to ``trajectory.terms`` in place
(reward models, ``taskrl.monitors.shape_rewards``); they are scored with the env's terms, so the gates and the
invalid-call cap still have the last word (writing ``trajectory.rewards`` is refused, naming ``terms``)."""


class Trainer:
    """One training run; see the module docstring. Optional parts are plain callables/objects."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        policy: HFPolicy | None = None,
        env_factory: Callable[[], Env] | None = None,
        task_sampler: TaskSampler | None = None,
        score_fn: ScoreFn | None = None,
        monitors: Monitors | None = None,
        weight_sync: WeightSync | None = None,
        console: Console | None = None,
        rollout_server: VLLMServer | None = None,  # rollout_policy="vllm": a server the caller started (and stops)
        env_spec: EnvSpec | None = None,
    ) -> None:
        """``policy`` defaults to ``HFPolicy.from_pretrained(config.model)``; ``env_factory`` to ``build_env``
        (``make(config.env)``, its tasks from ``config.tasks`` when set); ``env_spec`` (``taskrl.env_spec``: the
        tasks of ``split`` and ``eval_split``, rubric, tool names, expert rule) to one read from the factory's
        first env, closed at once; ``task_sampler`` (a ``taskrl.training.data.TaskSampler``) to ``EpochSampler``."""
        self.config = cfg = config
        self.console = console or Console()
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        torch.manual_seed(cfg.seed)  # LoRA and value-head initialisation
        # The env first: a wrong env name or split fails before the model is loaded.
        loaded = load_tasks(cfg.tasks, columns=cfg.task_columns) if cfg.tasks else None  # read once, fail first
        self.env_factory = env_factory or functools.partial(
            build_env, cfg.env, cfg.env_kwargs, cfg.tasks, cfg.task_columns, loaded
        )
        # What the run knows of its env (tasks, rubric, tool names, expert rule), read from one instance that is
        # closed at once: every episode plays on a fresh env from the factory.
        spec = env_spec if env_spec is not None else read_spec(self.env_factory, [cfg.split, cfg.eval_split])
        self.spec = spec
        self.rubric = spec.rubric  # how measured terms become the reward: taskrl.scoring
        self.failure_reward = self.rubric.failure_reward
        self._clocks: dict[int, Clock] = {}  # each step's training position, fixed when its tasks are drawn
        tasks = list(spec.tasks(cfg.split))
        if not tasks:
            raise ConfigError(f"TrainConfig.split: env '{cfg.env}' has no tasks in split '{cfg.split}'")
        rule = spec.scripted_rule
        if cfg.phases[0] and cfg.sft_data == "expert" and rule is None:
            raise ConfigError(
                f"TrainConfig.sft_data='expert' needs env '{cfg.env}' to define scripted_rule; "
                "use sft_data='policy' or a trajectories JSONL"
            )
        from_file = cfg.phases[0] and cfg.sft_data not in ("expert", "policy")
        self.sft_file = TrajectoryFile(cfg.sft_data, cfg.seed) if from_file else None
        self.tasks_by_id = {t.id: t for t in tasks}
        self.sampler: TaskSampler = task_sampler if task_sampler is not None else EpochSampler(tasks, cfg.seed)
        self.score_fn = score_fn
        self.monitors = (
            monitors
            if monitors is not None
            else Monitors(tool_names=list(spec.tool_names), max_turns=cfg.rollout.max_turns)
        )
        self.reward_weights = {
            term: make_schedule(spec, field=f"TrainConfig.reward_weights.{term}")
            for term, spec in cfg.reward_weights.items()
        }
        self.group = DataParallel.from_process_group()  # nproc > 1: rank 0 writes the run directory for all ranks
        self.run = RunLog(cfg.run_dir, backends=cfg.log_backends if self.group.is_main else [])
        # A rollout server is checked before the model loads: a wrong URL or model name fails in seconds.
        server = connect_server(cfg) if cfg.placement.rollout_policy == "server" else None
        self.vllm: VLLMEngine | None = None  # rollout_policy="vllm": the supervised server, started before the model
        if cfg.placement.rollout_policy == "vllm":
            from taskrl.training.vllm_rollout import VLLMEngine

            self.vllm = VLLMEngine.start(cfg, rollout_server)
        self.rollouts = RolloutLoop()  # every rollout and evaluation of the run plays on this loop's thread
        self._owns_policy = policy is None
        if policy is None:
            # rollouts want the batch done soonest, not each row's pace: full prefill chunks
            weights, why = weights_dtype(cfg.dtype, cfg.device)
            self.console.print(f"weights: {str(weights).removeprefix('torch.')} ({why})")
            policy = HFPolicy.from_pretrained(cfg.model, device=cfg.device, dtype=weights,
                                              engine_config=EngineConfig(schedule="throughput"))
        # The learner's model holder: evaluation, export, tokenizer; it samples too when rollout_policy="inprocess".
        self.learner_policy: HFPolicy = policy
        policy.model = prepare_model(policy.model, cfg)
        tokenizer = policy.chat_format.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # The rollout copy is taken before the learner exists: an fsdp2 learner shards the model in place.
        device = next(policy.model.parameters()).device
        rollout_dtype, why = resolve(cfg.placement.rollout_dtype, device, same=next(policy.model.parameters()).dtype)
        early_copy = rollout_copy(policy, rollout_dtype) if cfg.placement.rollout_policy == "copy" else None
        self.learner = Learner(policy.model, cfg, pad_id=int(pad or 0), data_parallel=self.group)
        rollout_note = f"rollout {str(rollout_dtype).removeprefix('torch.')} ({why})" if early_copy else ""
        self.console.print(f"precision: {', '.join(filter(None, [self.learner.precision_note, rollout_note]))}")
        # ``self.policy`` samples the rollouts: the learner's own policy, a synced copy, or a served model.
        self.policy: HFPolicy | OpenAIPolicy
        if self.vllm is not None:
            self.policy, default_sync = self.vllm.attach(self.learner, policy, self.run.dir, run=self.rollouts.run)
        else:
            self.policy, default_sync = rollout_setup(
                cfg, self.learner, policy, self.run.dir, server_policy=server, copy_policy=early_copy
            )
        self.weight_sync: WeightSync = weight_sync or default_sync
        self.ray_rollout: Any = None
        if cfg.placement.ray:  # rollout actors with their own policy copies; the local policy still serves evaluation
            from taskrl.distributed.ray_rollout import RayRollout, RaySync

            factory = self.vllm.remote_policy_factory() if self.vllm is not None else None
            self.ray_rollout = RayRollout(cfg, env_factory=env_factory, policy_factory=factory)
            self.ray_rollout.check_weights(policy.model)
            self.weight_sync = RaySync(
                self.ray_rollout, self.learner, local=self.weight_sync, rollout_policy=self.policy
            )
            self.weight_sync(self.learner.version)  # the actors start from the learner's exact weights
        use_expert = cfg.phases[0] and cfg.sft_data == "expert"
        self.expert = ScriptedPolicy(rule, name="expert", chat_format=policy.chat_format) if use_expert else None
        self.completed: int | None = None  # steps done once ``train`` has resumed; None before
        self._ahead: tuple[int, Future[list[Trajectory]]] | None = None  # async_rollout: next step in flight
        self._sync_due = False  # async_rollout: an update waits to be synced when the in-flight rollouts end
        self._data_state: dict[str, Any] | None = None  # sampler state to checkpoint once the next step is drawn
        self._rollout_times: dict[int, tuple[float, float]] = {}
        self._end = 0
        self._clock0 = time.monotonic()

    # -- the four parts of a step ------------------------------------------------------------------
    def is_sft_step(self, step: int) -> bool:
        return step < self.config.phases[0]

    def env_factory_at(self, step: int, epoch: int) -> Callable[[], Env]:
        """Envs for this step: the run's factory. Envs are told nothing about training: the step's clock enters
        only when the batch is scored (``score``)."""
        return self.env_factory

    def collect(self, step: int) -> list[Trajectory]:
        """Play this step's episodes (the expert's or a JSONL's in SFT warm-up steps) and add group terms."""
        return self.rollouts.run(self._plan(step))

    def _plan(self, step: int) -> Coroutine[Any, Any, list[Trajectory]]:
        """Draw this step's tasks and seeds now, on the caller's thread and in step order (so sampler state and
        reward clocks advance as in a serial run); returns the coroutine that plays them on the rollout loop."""
        cfg = self.config
        epoch = self.sampler.epoch
        self._clocks[step] = Clock(step, epoch)  # the batch is scored at it, however late it is played
        sft_step = self.is_sft_step(step)
        if sft_step and self.sft_file is not None:
            return _ready(self.group.shard(self.sft_file.take(cfg.rollout.tasks_per_step * cfg.rollout.group_size)))
        rng = random.Random(derive_seed(cfg.seed, "tasks", step))
        tasks = self.sampler.sample(step, cfg.rollout.tasks_per_step, rng)
        # Every rank draws the same tasks and plays its share (whole groups), seeded by each task's index in the
        # whole step, so the ranks together sample exactly the episodes one process would.
        indices = self.group.shard(range(len(tasks)))
        tasks = [tasks[i] for i in indices]
        expert = sft_step and self.expert is not None
        rollout = self._rollout_config(derive_seed(cfg.seed, "rollout", step), expert=expert)
        return self._play(step, epoch, tasks, rollout, expert, indices)

    def _rollout_config(self, seed: int, *, expert: bool) -> RolloutConfig:
        cfg = self.config
        return RolloutConfig(
            max_turns=cfg.rollout.max_turns,
            max_context_tokens=cfg.rollout.max_context_tokens,
            sampling=SamplingParams(
                max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p
            ),
            group_size=1 if expert else cfg.rollout.group_size,  # a deterministic expert's K samples would be identical
            concurrency=cfg.rollout.concurrency,
            seed=seed,
            summary=context.from_value(cfg.rollout.summary, "rollout.summary"),
            engine_failures="drop",  # one failed request is no sample of the policy; a dead engine fails the step
        )

    async def _play(
        self, step: int, epoch: int, tasks: list[Task], rollout: RolloutConfig, expert: bool, indices: list[int]
    ) -> list[Trajectory]:
        if self.vllm is None or expert:
            return await self._play_once(step, epoch, tasks, rollout, expert, indices)
        # rollout_policy="vllm": a server that dies under the step is restarted and the step's episodes replayed
        return await self.vllm.play(
            lambda: self._play_once(step, epoch, tasks, rollout, expert, indices), step=step,
            episodes=len(tasks) * rollout.group_size, tasks=tasks, rollout=rollout,
            env_factory=self.env_factory_at(step, epoch),
        )  # fmt: skip

    async def _play_once(
        self, step: int, epoch: int, tasks: list[Task], rollout: RolloutConfig, expert: bool, indices: list[int]
    ) -> list[Trajectory]:
        started = time.monotonic()
        if self.ray_rollout is not None and not expert:
            # ray.get blocks: a worker thread keeps the rollout loop free (evaluations may share it).
            trajectories = await asyncio.to_thread(self.ray_rollout.collect, tasks, rollout, step=step, epoch=epoch)
        else:
            policy = self.expert if expert else self.policy
            factory = self.env_factory_at(step, epoch)
            trajectories = await run_episodes(factory, policy, tasks, rollout, task_indices=indices)
        first_started = self._rollout_times.get(step, (started, 0.0))[0]  # dynamic sampling's rounds add up
        self._rollout_times[step] = (first_started, time.monotonic())
        return trajectories

    def score(self, step: int, trajectories: list[Trajectory], *, clock: Clock | None = None) -> None:
        """``taskrl.scoring.score_collected`` at this step's clock (the path ``taskrl eval`` takes too): extra
        measurements (``score_fn``), then term weights (the rubric's times ``reward_weights``), derived terms at
        the clock (Context-1's β), group terms, clamp, gates, invalid-call cap, once and in order."""
        score_collected(
            trajectories, None, clock or self.clock_of(step), rubric=self.rubric,
            reward_weights=self.reward_weights, task_of=self.tasks_by_id.get, measure=self.score_fn,
        )  # fmt: skip

    def _play_more(self, step: int, clock: Clock, round_: int, n: int) -> list[Trajectory]:
        """Dynamic sampling's extra round ``round_`` of ``step``: ``n`` more tasks from the sampler, played with
        seeds of their own and scored at the step's clock."""
        cfg = self.config
        tasks = self.sampler.sample(step, n, random.Random(derive_seed(cfg.seed, "tasks", step, "more", round_)))
        rollout = self._rollout_config(derive_seed(cfg.seed, "rollout", step, "more", round_), expert=False)
        trajectories = self.rollouts.run(self._play(step, clock.epoch, tasks, rollout, False, list(range(n))))
        self.score(step, trajectories, clock=clock)
        return trajectories

    def clock_of(self, step: int) -> Clock:
        """The training position of ``step``: fixed when its tasks were drawn (a batch played ahead keeps its own)."""
        return self._clocks.pop(step, None) or Clock(step, self.sampler.epoch)

    def train_step(self, step: int) -> dict[str, Any]:
        """Collect, score, update, sync, log one step; returns its metrics (also appended to metrics.jsonl)."""
        cfg = self.config
        sft_step = self.is_sft_step(step)
        start = time.perf_counter()
        trajectories, sync_metrics = self._take_batch(step)
        clock = self.clock_of(step)
        self.score(step, trajectories, clock=clock)
        train_on, dynamic = trajectories, {}
        if cfg.dynamic_sampling and not sft_step:  # DAPO: refill the batch with groups that carry a signal
            filled = fill_batch(trajectories, lambda round_, n: self._play_more(step, clock, round_, n),
                                groups_wanted=cfg.rollout.tasks_per_step, max_rounds=cfg.dynamic_sampling_max_rounds)
            trajectories, train_on, dynamic = filled.played, filled.train, filled.metrics
        collected = time.perf_counter()
        own, trajectories = train_on, self.group.gather(trajectories)  # all ranks: the whole batch, rank order
        check_infra_failures(step, trajectories)
        for task_id, group in _by_task([t for t in trajectories if t.infra_failure is None]).items():
            if task_id in self.tasks_by_id:
                self.sampler.update(task_id, [t.reward for t in group])
        self._prefetch(step + 1)  # async_rollout: the next step's episodes play while this update runs
        version, update_started = self.learner.version, time.perf_counter()
        metrics = self._on_model_thread(lambda: self.learner.update(own, step=step, sft_mode=sft_step))
        updated = time.perf_counter()
        metrics.update(sync_metrics)
        metrics.update(dynamic)
        metrics.update(self._sync_after_update(step + 1))
        metrics.update(staleness_metrics(own, version))
        metrics.update(self.vllm.step_metrics(step) if self.vllm is not None and not sft_step else {})
        metrics.update(self._timeline(step, update_started, updated))
        metrics.update(batch_metrics(trajectories, self.rubric, clock))
        monitor_metrics, alerts = self.monitors.check(step + 1, trajectories)
        metrics.update(monitor_metrics)
        for alert in alerts if self.group.is_main else []:
            self.run.alert(alert.step, alert.monitor, alert.value, alert.threshold, alert.message)
        cut = sum(t.info.get("truncation") == "max_new_tokens" for t in trajectories)
        if sft_step and self.expert is not None and cut and self.group.is_main:  # SFT on broken calls teaches nothing
            message = (f"the expert's turn was cut by max_new_tokens={cfg.rollout.max_new_tokens} in {cut} of "
                       f"{len(trajectories)} demonstrations (a tool call left unfinished); raise max_new_tokens")
            self.run.alert(step + 1, "expert_cut", float(cut), 0.0, message)
            self.console.print(f"step {step + 1}: warning: {message}", highlight=False, markup=False)
        if (note := error_note(trajectories)) and self.group.is_main:  # a broken reward() must not train silently
            self.run.alert(step + 1, "episode_errors", metrics.get("charts/errors", 0.0), 0.0, note)
            self.console.print(f"step {step + 1}: {note}", highlight=False, markup=False)
        if metrics.get("charts/nonfinite_skipped") and self.group.is_main:
            skipped = metrics["charts/nonfinite_skipped"]
            self.run.alert(step + 1, NONFINITE_ALERT, skipped, 0.0,
                           f"{skipped:.0f} optimizer step(s) skipped: non-finite loss or gradient")  # fmt: skip
        metrics.update(self.sampler.metrics())
        sampled = sum(t.num_sampled_tokens for t in trajectories)
        metrics.update({
            "charts/phase": "sft" if sft_step else cfg.algo.name,
            "charts/step_time_s": updated - start,
            # How long the episodes played (they may have overlapped the previous update) vs how long we waited.
            "charts/rollout_time_s": metrics.pop("timeline/rollout_s", collected - start),
            "charts/rollout_wait_s": collected - start,
            "charts/update_time_s": updated - update_started,
            "charts/tokens_per_s": sampled / max(updated - start, 1e-9),
            "charts/update_tokens_per_s": metrics.get("charts/trained_tokens", 0.0)
            / max(updated - update_started, 1e-9),
        })  # fmt: skip
        if not self.group.is_main:
            return metrics
        if cfg.log_trajectories:
            self.run.write_trajectories(step + 1, trajectories)
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            metrics.update(eval_metrics(self.evaluate(step + 1)))
        self.run.log(step + 1, metrics)
        return metrics

    def evaluate(self, step: int, name: str | None = None) -> dict[str, Any]:
        """Greedy episodes on ``eval_split``: ``taskrl.eval`` results, also written to run_dir/eval/NAME.json."""
        cfg = self.config
        tasks = list(self.spec.tasks(cfg.eval_split))[: cfg.eval_tasks]
        config = EvalConfig(
            samples_per_task=1,
            temperature=0.0,
            max_turns=cfg.rollout.max_turns,
            max_context_tokens=cfg.rollout.max_context_tokens,
            max_new_tokens=cfg.rollout.max_new_tokens,
            concurrency=cfg.rollout.concurrency,
            seed=cfg.seed,
            summary=context.from_value(cfg.rollout.summary, "rollout.summary"),
        )
        name = name or f"step_{step:06d}"
        # The learner's own weights, whatever samples the rollouts: an evaluation scores exactly this step's model
        # (a sharded learner cannot decode alone: its rollout copy holds the same weights, synced after each update).
        policies = {"policy": self.policy if self.learner.sharded else self.learner_policy}
        return self.rollouts.run(
            evaluate(self.env_factory, policies, tasks, config, run_log=self.run, name=name, step=step,
                     clock=Clock(step, self.sampler.epoch), reward_weights=self.reward_weights, spec=self.spec)
        )  # fmt: skip

    # -- overlap and sync --------------------------------------------------------------------------
    def _on_model_thread(self, work: Callable[[], Any]) -> Any:
        """Run learner work on the learner policy's decode thread when it has one: between decode batches (the
        in-process rollout policy samples from this very model), and with one OpenMP thread team for all torch
        work, since a second team on the main thread slows decoding ~50% on a few cores."""
        return self.learner_policy.run_exclusive(work)

    def _take_batch(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """This step's trajectories (already in flight with async_rollout, else played now) and the metrics of
        the deferred sync that runs once no rollout is in flight."""
        ahead, self._ahead = self._ahead, None
        trajectories = None
        if ahead is not None and ahead[0] == step:
            trajectories = ahead[1].result()
        elif ahead is not None:  # a step this run no longer plays next (an earlier step failed): drop it
            ahead[1].cancel()
        sync_metrics = self._sync(step) if self._sync_due else {}
        self._sync_due = False
        return (trajectories if trajectories is not None else self.collect(step)), sync_metrics

    def _prefetch(self, step: int) -> None:
        """async_rollout: start ``step``'s episodes now, with the weights synced so far (one step ahead at most)."""
        self._data_state = None
        if not self.config.rollout.async_rollout or step >= self._end:
            return
        self._data_state = self._data_snapshot()  # what a serial run would checkpoint after this step
        self._ahead = (step, self.rollouts.submit(self._plan(step)))

    def _sync_after_update(self, completed: int) -> dict[str, float]:
        """Sync now, or, while the next step's rollouts play, when they end: every rollout then samples from one
        version from start to end, so an async run is as reproducible as a serial one."""
        if self._ahead is not None:
            self._sync_due = True
            return {}
        return self._sync(completed)

    def _sync(self, step: int) -> dict[str, float]:
        """Run the weight sync; a failure is reported (console, alert, metric), never fatal: the next one retries."""
        started = time.perf_counter()
        failed = 0.0
        try:
            self.weight_sync(self.learner.version)
        except WeightSyncError as e:
            failed = 1.0
            self.console.print(f"step {step}: {e}", highlight=False, markup=False)
            if self.group.is_main:
                rollout_version = float(self.policy.version)
                self.run.alert(step, "weight_sync", float(self.learner.version), rollout_version, str(e))
        return {"charts/sync_time_s": time.perf_counter() - started, "charts/sync_failed": failed}

    def _timeline(self, step: int, update_started: float, updated: float) -> dict[str, float]:
        """When this step's rollouts and update ran, in seconds on one clock since the trainer was built."""
        clock = time.monotonic() - time.perf_counter()  # perf_counter stamps -> the monotonic clock
        out = {
            "timeline/update_start_s": update_started + clock - self._clock0,
            "timeline/update_end_s": updated + clock - self._clock0,
        }
        if step in self._rollout_times:
            rollout_start, rollout_end = self._rollout_times.pop(step)
            out.update({
                "timeline/rollout_start_s": rollout_start - self._clock0,
                "timeline/rollout_end_s": rollout_end - self._clock0,
                "timeline/rollout_s": rollout_end - rollout_start,
            })  # fmt: skip
        return out

    def _data_snapshot(self) -> dict[str, Any]:
        state: dict[str, Any] = {"sampler": copy.deepcopy(self.sampler.state_dict())}
        if self.sft_file is not None:
            state["sft_file"] = copy.deepcopy(self.sft_file.state_dict())
        return state

    # -- the run -----------------------------------------------------------------------------------
    def resume(self) -> int:
        """Load the run directory's latest checkpoint if any; return the number of completed steps."""
        cfg = self.config
        checkpoint = latest_checkpoint(cfg.run_dir)
        check_resumable(self.run.dir, cfg, has_checkpoint=checkpoint is not None)
        if checkpoint is None:
            if self.group.is_main:
                rewind_run_dir(self.run.dir, 0)  # a run killed before its first checkpoint starts over
            return 0
        state = load_checkpoint(checkpoint, self.learner)
        self.sampler.load_state_dict(state["sampler"])
        if self.sft_file is not None:
            self.sft_file.load_state_dict(state["sft_file"])
        self._sync(int(state["step"]))
        if self.group.is_main:  # every rank loads the checkpoint; one rewinds the shared run directory
            rewind_run_dir(self.run.dir, int(state["step"]))
        self.console.print(f"resuming {cfg.run_dir} from {checkpoint.name} (policy version {self.learner.version})")
        return int(state["step"])

    def checkpoint(self, completed: int) -> Path | None:
        """Save on rank 0 (None elsewhere), after checking that every rank holds the same weights."""
        self.group.check_in_sync(self.learner.replicated_state(), f"checkpoint at step {completed}")
        # fsdp2: every rank writes its shards
        if not self.group.is_main and self.config.placement.learner_backend != "fsdp2":
            return None
        state = self._data_state or self._data_snapshot()
        path = save_checkpoint(self.run.dir, completed, self.learner, state, keep=self.config.keep_checkpoints)
        return path if self.group.is_main else None

    def train(self, until: int | None = None) -> list[dict[str, Any]]:
        """Run (resuming on the first call) up to step ``until`` (default: all ``config.steps``).

        Returns the metrics of the steps run by this call; the policy is exported to run_dir/policy at the end.
        """
        cfg = self.config
        if self.completed is None:
            self.completed = self.resume()
            self.group.broadcast_(self.learner.replicated_state())  # all ranks start from rank 0's weights
            if self.group.is_main:
                self.run.write_config(cfg)
        end = cfg.steps if until is None else min(until, cfg.steps)
        self._end = end  # async_rollout never plays ahead past the steps this call runs
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
                    self.console.print(step_line(self.completed, cfg.steps, metrics), highlight=False, markup=False)
        if self.completed == cfg.steps and (rows or not (self.run.dir / "policy").exists()):
            self.export(self.run.dir / "policy")  # every rank: a sharded learner gathers the weights on all
        return rows

    def export(self, path: Path) -> Path:
        """Save the trained policy (rank 0): the LoRA adapter or the full model, with the tokenizer. Refuses
        non-finite weights; a sharded learner's weights are gathered (every rank must call it)."""
        check_finite(self.learner, f"the policy export to {path}")
        state = self.learner.full_state_dict() if self.learner.sharded else None
        if not self.group.is_main:
            return path
        kwargs = {"state_dict": state} if state is not None else {}
        self.learner.model.save_pretrained(str(path), **kwargs)
        self.learner_policy.chat_format.tokenizer.save_pretrained(str(path))
        if self._owns_policy:  # built from config.model: the adapter loads offline (`taskrl eval --policy hf:RUN`)
            record_base_model(path, self.config.model)
        return path

    def close(self) -> None:
        self.run.close()
        if self.ray_rollout is not None:
            self.ray_rollout.close()
        if self._ahead is not None:
            self._ahead[1].cancel()
        own_rollout_policy = self.policy is not self.learner_policy  # a copy or a server client this trainer built
        if own_rollout_policy:
            self.rollouts.run(self.policy.aclose())  # its connections belong to the rollout loop
        self.rollouts.close()  # cancels whatever still plays, before the decode threads stop
        if own_rollout_policy:
            self.policy.close()
        if self._owns_policy:
            self.learner_policy.close()
        if self.vllm is not None:
            self.vllm.close()

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
def _by_task(trajectories: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        out[t.task_id].append(t)
    return out


async def _ready(trajectories: list[Trajectory]) -> list[Trajectory]:
    """Trajectories that need no playing (SFT from a file), as a rollout coroutine."""
    return trajectories
