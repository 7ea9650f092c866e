"""Ray rollout workers: a training step's episodes played by ``ray_workers`` actors, each with its own policy copy.

    rollout = RayRollout(config)                      # starts (or joins) Ray and the actors
    rollout.push(learner.trainable_state(), version)  # once per update: one ray.put, every actor loads it
    trajectories = rollout.collect(tasks, rollout_config, step=step, epoch=epoch)

Actors build their policy (``config.model`` with the trainer's LoRA/freeze set-up, or a ``policy_factory``) and
their envs themselves; nothing heavy is pickled. Whole groups stay on one actor and every episode keeps the seed
the in-process path gives it, so a Ray step samples the same episodes as a local one. ``Trainer`` uses this when
``placement.ray`` is set (``RaySync`` is its weight sync). Ray is imported only when an instance is created.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taskrl.env import Env
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.task_files import build_env
from taskrl.types import Task, Trajectory

if TYPE_CHECKING:
    import torch

    from taskrl.policies.base import Policy
    from taskrl.training.config import TrainConfig

SYNC_TIMEOUT_S = 600.0
"""Longest wait for every actor to load new weights; a sync that hangs fails instead of stalling the run."""
START_TIMEOUT_S = 900.0
"""Longest wait for the actors to build their policies (a model load on a busy node)."""
VALUE_HEAD_PREFIX = "value_head."  # ``Learner.trainable_state`` keys of PPO's head: the learner's, not the sampler's


class RolloutWorkerError(RuntimeError):
    """A rollout actor failed (or died twice) on its share of a step; the message names the worker and tasks."""


def connect(address: str = "", *, num_cpus: int | None = None) -> bool:
    """Make sure this process is attached to Ray; returns True when this call started a local Ray.

    ``address`` "" starts a local Ray (unless one is attached already), "auto" or "ray://host:port" connects.
    """
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
        return False
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    return True


@dataclass(frozen=True)
class _Job:
    """One task of a step as an actor plays it: the task's index in the step (its seeds) and the task."""

    index: int
    task: Task


def hf_rollout_policy(config: TrainConfig) -> Policy:
    """The trainer's rollout policy rebuilt in a worker: ``config.model`` with the same dtype, device rule and
    trainable set-up (LoRA adapters or frozen names), so ``Learner.trainable_state`` loads into it by name."""
    import torch

    from taskrl.policies.hf import EngineConfig, HFPolicy
    from taskrl.policies.precision import weights_dtype
    from taskrl.training.model import prepare_model

    dtype, _ = weights_dtype(config.dtype, config.device)
    policy = HFPolicy.from_pretrained(config.model, device=config.device, dtype=dtype,
                                      engine_config=EngineConfig(schedule="throughput"))
    torch.manual_seed(config.seed)  # the trainer's LoRA initialisation (overwritten by the first push anyway)
    policy.model = prepare_model(policy.model, config)
    return policy


def _trainable(model: Any) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def parameter_sums(model: Any, *, frozen_only: bool = True) -> dict[str, float]:
    """Per parameter, the float64 sum of its values: a cheap fingerprint to check two copies hold the same weights."""
    return {
        name: float(p.detach().double().sum())
        for name, p in model.named_parameters()
        if not (frozen_only and p.requires_grad)
    }


class RolloutActor:
    """Runs inside a Ray actor: one policy, envs built per episode, episodes of the tasks it is given."""

    def __init__(self, worker: int, policy_factory: Callable[[], Policy], env_factory: Callable[[], Env]) -> None:
        self.worker = worker
        self.policy = policy_factory()
        self.env_factory = env_factory

    async def ready(self) -> dict[str, float]:
        """The fingerprint of the frozen weights (empty for a policy without an in-process model)."""
        from taskrl.policies.hf import HFPolicy

        return parameter_sums(self.policy.model) if isinstance(self.policy, HFPolicy) else {}

    async def load_weights(self, state: dict[str, torch.Tensor], version: int, served_model: str | None = None) -> int:
        """Copy the learner's trainable tensors into the local model by name (a served policy instead switches to
        ``served_model``, the adapter the server just loaded); stamp later samples ``version``."""
        import torch

        from taskrl.policies.hf import HFPolicy
        from taskrl.policies.openai import OpenAIPolicy

        if served_model is not None and isinstance(self.policy, OpenAIPolicy):
            self.policy.model = served_model
        if state and isinstance(self.policy, HFPolicy):
            own = _trainable(self.policy.model)
            missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            if missing or unexpected:
                raise ValueError(
                    f"rollout worker {self.worker}: pushed weights do not fit its model (missing {missing[:3]}, "
                    f"unexpected {unexpected[:3]}); the worker must be built with the trainer's model and config"
                )
            with torch.no_grad():
                for name, param in own.items():
                    param.copy_(state[name].to(param.device, param.dtype))
        self.policy.version = version
        return version

    async def play(self, jobs: list[_Job], rollout: RolloutConfig) -> list[Trajectory]:
        """``rollout.group_size`` episodes per job, seeded by the job's index in the step as a local run seeds it;
        the envs know nothing of the training clock (the driver scores the batch at it), as in a local run."""
        tasks, indices = [job.task for job in jobs], [job.index for job in jobs]
        return await run_episodes(self.env_factory, self.policy, tasks, rollout, task_indices=indices)


class RayRollout:
    """The driver's handle on the rollout actors: split a step across them, gather in order, push weights."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        env_factory: Callable[[], Env] | None = None,
        policy_factory: Callable[[], Policy] | None = None,
    ) -> None:
        """``env_factory`` (picklable; default ``build_env``: ``make(config.env)``, ``config.tasks``) runs in actors;
        ``policy_factory`` too; its default is ``hf_rollout_policy(config)``, or with ``rollout_policy="server"`` an
        ``OpenAIPolicy`` per actor on ``config.placement.rollout_url`` (the trainer's sync loads adapters into the
        server).
        """
        import ray

        self.config = config
        self._owns_ray = connect(config.placement.ray_address)
        self._env_factory = env_factory or functools.partial(
            build_env, config.env, config.env_kwargs, config.tasks, config.task_columns
        )
        self._policy_factory = policy_factory or _default_policy_factory(config)
        self._remote = ray.remote(RolloutActor).options(
            num_cpus=config.placement.ray_num_cpus_per_worker, num_gpus=config.placement.ray_num_gpus_per_worker
        )
        self._weights: tuple[Any, int, str | None] | None = None  # last push: (object ref, version, served model)
        self.restarts = 0
        try:
            self.actors = [self._spawn(i) for i in range(config.placement.ray_workers)]
        except (TypeError, pickle.PicklingError) as e:
            raise RolloutWorkerError(
                f"the env or policy factory cannot be sent to Ray actors ({e}); pass a picklable callable "
                "(a module-level function or class, functools.partial) or leave env_factory unset"
            ) from e
        self.fingerprints = self._wait_ready(range(len(self.actors)))

    # -- actors ---------------------------------------------------------------------------------------
    def _spawn(self, worker: int) -> Any:
        return self._remote.remote(worker, self._policy_factory, self._env_factory)

    def _wait_ready(self, workers: Sequence[int]) -> list[dict[str, float]]:
        import ray

        refs = [self.actors[w].ready.remote() for w in workers]
        try:
            return ray.get(refs, timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RolloutWorkerError(
                f"rollout workers {list(workers)} did not start within {START_TIMEOUT_S:g}s; check that the Ray "
                f"cluster has {self.config.placement.ray_num_cpus_per_worker:g} CPU(s) and "
                f"{self.config.placement.ray_num_gpus_per_worker:g} GPU(s) free per worker (`ray status`)"
            ) from None
        except ray.exceptions.RayError as e:
            raise RolloutWorkerError(f"rollout workers {list(workers)} failed to build their policy: {e}") from e

    def _restart(self, worker: int) -> None:
        """Replace a dead actor and give it the current weights and version."""
        import ray

        ray.kill(self.actors[worker], no_restart=True)
        self.actors[worker] = self._spawn(worker)
        self._wait_ready([worker])
        if self._weights is not None:
            ref, version, served_model = self._weights
            ray.get(self.actors[worker].load_weights.remote(ref, version, served_model), timeout=SYNC_TIMEOUT_S)
        self.restarts += 1

    def check_weights(self, model: Any) -> None:
        """Refuse to train when the actors' frozen weights differ from ``model``'s: pushes carry only the trainable
        tensors, so the base must be the same model on both sides."""
        local = parameter_sums(model)
        for worker, remote in enumerate(self.fingerprints):
            if not remote:
                continue  # a served policy: its weights live on the server
            differing = [name for name, value in local.items() if not _close(value, remote.get(name))]
            if differing or set(remote) != set(local):
                first = differing[0] if differing else sorted(set(remote) ^ set(local))[0]
                raise RolloutWorkerError(
                    f"rollout worker {worker} built {self.config.model!r} but its weights differ from the trainer's "
                    f"model (first: {first}); with ray=true the trainer's policy must be TrainConfig.model "
                    "(do not pass a different policy object), and both must use the same finetune/freeze set-up"
                )

    # -- weights --------------------------------------------------------------------------------------
    def push(self, state: dict[str, torch.Tensor], version: int, *, served_model: str | None = None) -> None:
        """Put the trainable state in the object store once and have every actor load it (bounded wait).

        Actors with a served policy ignore the tensors and switch to ``served_model`` (send an empty state then)."""
        import ray

        cpu = {k: v.detach().to("cpu") for k, v in state.items() if not k.startswith(VALUE_HEAD_PREFIX)}
        ref = ray.put(cpu)
        self._weights = (ref, version, served_model)
        refs = [actor.load_weights.remote(ref, version, served_model) for actor in self.actors]
        try:
            ray.get(refs, timeout=SYNC_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RolloutWorkerError(
                f"weight sync to version {version} did not finish within {SYNC_TIMEOUT_S:g}s on the rollout workers"
            ) from None
        except ray.exceptions.RayActorError:
            # A dead actor gets the weights when it is restarted (``collect`` restarts it); the others have them.
            pass
        except ray.exceptions.RayTaskError as e:
            raise RolloutWorkerError(f"weight sync to version {version} failed on a rollout worker: {e.cause}") from e

    @property
    def version(self) -> int | None:
        """The version last pushed to the actors (None before the first push)."""
        return self._weights[1] if self._weights is not None else None

    # -- rollouts -------------------------------------------------------------------------------------
    def shares(self, tasks: Sequence[Task]) -> list[list[_Job]]:
        """Tasks dealt round-robin to the actors; a task's whole group stays on one actor."""
        shares: list[list[_Job]] = [[] for _ in self.actors]
        for index, task in enumerate(tasks):
            shares[index % len(self.actors)].append(_Job(index, task))
        return shares

    def collect(self, tasks: Sequence[Task], rollout: RolloutConfig, *, step: int, epoch: int = 0) -> list[Trajectory]:
        """Play ``rollout.group_size`` episodes of every task across the actors; trajectories in task order.

        An actor that dies is restarted (with the current weights) and its share is played once more; a second
        death, or any error raised while playing, fails with ``RolloutWorkerError`` naming the worker and tasks.
        ``step`` names the step in errors (``epoch`` is unused here: the driver scores the batch at its clock).
        """
        import ray

        shares = self.shares(tasks)
        busy = [w for w, share in enumerate(shares) if share]
        results: dict[int, list[Trajectory]] = {}
        pending = {w: self.actors[w].play.remote(shares[w], rollout) for w in busy}
        for attempt in (0, 1):
            dead = []
            for worker, ref in pending.items():
                try:
                    results[worker] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    if attempt == 1:
                        raise RolloutWorkerError(
                            f"rollout worker {worker} died twice playing tasks {_ids(shares[worker])} at step "
                            f"{step} ({_first_line(e)}); see the worker's log, e.g. for an out-of-memory kill"
                        ) from e
                    dead.append(worker)
                except ray.exceptions.RayTaskError as e:
                    raise RolloutWorkerError(
                        f"rollout worker {worker} failed playing tasks {_ids(shares[worker])} at step {step}: "
                        f"{e.cause!r}"
                    ) from e
            for worker in dead:
                self._restart(worker)
            pending = {w: self.actors[w].play.remote(shares[w], rollout) for w in dead}
            if not pending:
                break
        by_index: dict[int, list[Trajectory]] = {}
        for worker in busy:
            group_size = rollout.group_size
            for j, job in enumerate(shares[worker]):
                by_index[job.index] = results[worker][j * group_size : (j + 1) * group_size]
        return [traj for index in range(len(tasks)) for traj in by_index[index]]

    def close(self) -> None:
        """Stop the actors (and the local Ray this instance started)."""
        import ray

        if not ray.is_initialized():
            return
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self._owns_ray:
            ray.shutdown()


class RaySync:
    """``WeightSync`` for Ray rollouts: the trainer's own sync first (a version bump, a local copy, or a LoRA load
    into the rollout server), then ``learner.trainable_state()`` to every actor; actors with a served policy get
    the name of the adapter the server now serves instead of tensors."""

    def __init__(
        self,
        rollout: RayRollout,
        learner: Any,
        local: Callable[[int], None] | None = None,
        *,
        rollout_policy: Any = None,
    ) -> None:
        self.rollout = rollout
        self.learner = learner
        self.local = local
        self.rollout_policy = rollout_policy

    def __call__(self, version: int) -> None:
        if self.local is not None:
            self.local(version)  # may raise (a server that refused the adapter): the actors then keep the old one
        if self.rollout.version == version:  # a step without an update keeps the version: nothing to send
            return
        from taskrl.policies.openai import OpenAIPolicy

        if isinstance(self.rollout_policy, OpenAIPolicy):  # the server already loaded the adapter: switch to it
            self.rollout.push({}, version, served_model=self.rollout_policy.model)
        else:
            self.rollout.push(self.learner.trainable_state(), version)


def _default_policy_factory(config: TrainConfig) -> Callable[[], Policy]:
    if config.placement.rollout_policy != "server":
        return functools.partial(hf_rollout_policy, config)
    from taskrl.policies.openai import OpenAIPolicy

    # The key is read here, on the driver: the actors' nodes need not have the environment variable.
    api_key = os.environ.get(config.placement.rollout_api_key_env) or None
    place = config.placement
    return functools.partial(OpenAIPolicy, place.rollout_url.rstrip("/"), place.rollout_model, api_key=api_key,
                             timeout_s=600.0)  # fmt: skip


def _ids(jobs: Sequence[_Job]) -> list[str]:
    return [job.task.id for job in jobs]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _close(a: float, b: float | None) -> bool:
    return b is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
