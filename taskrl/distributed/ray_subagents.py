"""Swarm sub-agents on Ray actors: the assignments of one orchestrator turn run on different actors at once.

    runtime = RaySubagentRuntime(SubagentSpec(env_factory=lambda: make("search"), rollout=rollout), actors=4)
    child = await runtime.run(agent, "Find ...", task_id="t/a/0", seed=1, max_steps=20)

``RaySubagentRuntime`` has ``SubagentRuntime``'s interface and returns the same child trajectories (a sub-agent cut
off by its timeout keeps the turns it started; one whose actor stopped answering counts its whole step limit, so
critical steps never under-count). Each actor
builds its own frozen policy and wrapped envs from a picklable ``SubagentSpec`` and runs the in-process runtime;
the run interval is measured on the orchestrator's clock. Pools are shared per process (the swarm env is built per
episode); ``SwarmEnvConfig.subagent_backend = "ray"`` selects this runtime. Ray is imported on first use only.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taskrl.distributed.ray_rollout import START_TIMEOUT_S, connect
from taskrl.env import Env
from taskrl.envs.swarm.subagents import Subagent, SubagentRuntime
from taskrl.rollout import RolloutConfig
from taskrl.types import Trajectory

if TYPE_CHECKING:
    from taskrl.envs.swarm.env import SwarmEnvConfig

DISPATCH_GRACE_S = 60.0
"""Extra wait past the sub-agent timeout (which the actor enforces itself) before the orchestrator gives up on an
actor that stopped answering."""


@dataclass(frozen=True)
class SubagentSpec:
    """What every sub-agent actor builds for itself: picklable kinds and callables, never a loaded model."""

    env_factory: Callable[[], Env]
    """Builds the wrapped env of one assignment; runs inside the actor."""
    rollout: RolloutConfig
    """Sampling, context size and step limit of one sub-agent episode."""
    policy: Any = None
    """A picklable Policy copied to every actor (e.g. an ``OpenAIPolicy``); None: each actor builds ``policy_kind``."""
    policy_kind: str = "scripted"
    """"scripted" (the wrapped env's rule), "hf" (``model`` loaded in each actor) or "openai" (``base_url``)."""
    model: str = "smollm2"
    """Model of an "hf" or "openai" policy."""
    base_url: str | None = None
    """Server of an "openai" policy."""
    timeout_s: float = 600.0
    """Wall-clock limit of one assignment (enforced in the actor, as ``SubagentRuntime`` does)."""

    def __post_init__(self) -> None:
        if self.policy is None and self.policy_kind not in ("scripted", "hf", "openai"):
            raise ValueError(f"SubagentSpec.policy_kind must be 'scripted', 'hf' or 'openai', got {self.policy_kind!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"SubagentSpec.timeout_s must be > 0, got {self.timeout_s}")


class SubagentActor:
    """Runs inside a Ray actor: one frozen policy, a fresh wrapped env per assignment (``SubagentRuntime``)."""

    def __init__(self, index: int, spec: SubagentSpec) -> None:
        from taskrl.policies import make_policy

        policy = spec.policy
        if policy is None:
            env = spec.env_factory() if spec.policy_kind == "scripted" else None
            policy = make_policy(spec.policy_kind, model=spec.model, base_url=spec.base_url, env=env)
        self.index = index
        self.runtime = SubagentRuntime(policy, spec.env_factory, spec.rollout, timeout_s=spec.timeout_s)

    async def ready(self) -> int:
        return self.index

    async def run(self, agent: Subagent, task_text: str, task_id: str, seed: int, max_steps: int) -> Trajectory:
        child = await self.runtime.run(agent, task_text, task_id=task_id, seed=seed, max_steps=max_steps)
        child.info["actor_wall_s"] = child.info["ended_at"] - child.info["started_at"]  # this process's clock
        return child


class _ActorPool:
    """Actors of one spec; each assignment goes to the actor with the fewest assignments in flight."""

    def __init__(self, spec: SubagentSpec, actors: int, address: str, cpus_per_actor: float) -> None:
        import ray

        connect(address)
        self.spec = spec
        self._remote = ray.remote(SubagentActor).options(num_cpus=cpus_per_actor)
        self._lock = threading.Lock()
        self.in_flight = [0] * actors
        self.restarts = 0
        try:
            self.actors = [self._remote.remote(i, spec) for i in range(actors)]
        except (TypeError, pickle.PicklingError) as e:
            raise ValueError(
                f"the sub-agent policy or env factory cannot be sent to Ray actors ({e}); pass "
                "subagent_policy='scripted', 'hf' or 'openai' so that each actor builds its own"
            ) from e
        self._wait_ready(list(range(actors)))

    def _wait_ready(self, indices: list[int]) -> None:
        import ray

        try:
            ray.get([self.actors[i].ready.remote() for i in indices], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"sub-agent actors {indices} did not start within {START_TIMEOUT_S:g}s; check free CPUs (`ray status`)"
            ) from None

    def acquire(self) -> tuple[int, Any]:
        with self._lock:
            index = min(range(len(self.actors)), key=lambda i: (self.in_flight[i], i))
            self.in_flight[index] += 1
            return index, self.actors[index]

    def release(self, index: int) -> None:
        with self._lock:
            self.in_flight[index] -= 1

    def restart(self, index: int, dead: Any) -> None:
        """Replace actor ``index`` unless another caller already replaced the same dead handle."""
        import ray

        with self._lock:
            if self.actors[index] is not dead:
                return
            ray.kill(dead, no_restart=True)
            self.actors[index] = self._remote.remote(index, self.spec)
            self.restarts += 1
        self._wait_ready([index])

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
        self.actors = []


_POOLS: dict[Hashable, _ActorPool] = {}
_POOLS_LOCK = threading.Lock()


def shutdown_subagent_pools() -> None:
    """Stop every sub-agent actor pool of this process (before ``ray.shutdown``, or to free the cluster)."""
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()


class RaySubagentRuntime:
    """``SubagentRuntime`` on Ray actors; the actor pool starts on the first assignment and is shared per process."""

    def __init__(
        self,
        spec: SubagentSpec,
        *,
        actors: int = 4,
        address: str = "",
        cpus_per_actor: float = 0.5,
        pool_key: Hashable | None = None,
    ) -> None:
        """``pool_key`` names the pool to share (default: this spec's objects and settings)."""
        if actors < 1:
            raise ValueError(f"RaySubagentRuntime actors must be >= 1, got {actors}")
        if cpus_per_actor < 0:
            raise ValueError(f"RaySubagentRuntime cpus_per_actor must be >= 0, got {cpus_per_actor}")
        self.spec = spec
        self.actors = actors
        self.address = address
        self.cpus_per_actor = cpus_per_actor
        self.timeout_s = spec.timeout_s
        settings = (actors, address, cpus_per_actor)
        self.pool_key = pool_key if pool_key is not None else (id(spec), *settings)

    def pool(self) -> _ActorPool:
        """The shared pool of this runtime's key, started (blocking) when missing."""
        with _POOLS_LOCK:
            pool = _POOLS.get(self.pool_key)
            if pool is None:
                pool = _POOLS[self.pool_key] = _ActorPool(self.spec, self.actors, self.address, self.cpus_per_actor)
            return pool

    async def run(self, agent: Subagent, task_text: str, *, task_id: str, seed: int, max_steps: int) -> Trajectory:
        """One assignment on the least busy actor, as a child trajectory (``trainable=False``) whose
        ``info["started_at"/"ended_at"]`` are this process's ``time.monotonic()``. A dead actor is restarted and the
        assignment retried once; a second death or a lost actor returns a child with ``error`` set."""
        import ray

        if not ray.is_initialized():
            with _POOLS_LOCK:
                _POOLS.clear()  # handles into a Ray that was shut down are useless
            connect(self.address)  # on this thread: ray.init belongs on the caller's thread, not a helper one
        pool = await asyncio.to_thread(self.pool)
        started = time.monotonic()
        child: Trajectory | None = None
        for attempt in (0, 1):
            index, actor = pool.acquire()
            ref = actor.run.remote(agent, task_text, task_id, seed, max_steps)
            try:
                async with asyncio.timeout(self.timeout_s + DISPATCH_GRACE_S):
                    child = await ref
                break
            except ray.exceptions.RayActorError as e:
                if attempt == 1:
                    reason = str(e).strip().splitlines()[0] if str(e).strip() else "no reason given"
                    child = _failed(task_id, seed, f"RayActorError: sub-agent actor {index} died twice ({reason})")
                    break
                await asyncio.to_thread(pool.restart, index, actor)
            except TimeoutError:
                ray.cancel(ref)  # async actor tasks are cancelled, not force-killed (that would take the actor)
                child = _failed(task_id, seed, f"TimeoutError: sub-agent actor {index} stopped answering")
                child.metrics["turns"] = float(max_steps)  # its steps are unknown: count the most it may have run
                break
            except ray.exceptions.RayTaskError as e:
                child = _failed(task_id, seed, f"{type(e.cause).__name__}: {e.cause}")
                break
            finally:
                pool.release(index)
        assert child is not None
        child.trainable = False
        child.info.update(
            {"started_at": started, "ended_at": time.monotonic(), "name": agent.name, "agent_id": agent.agent_id,
             "ray_actor": index}
        )  # fmt: skip
        child.metrics.setdefault("turns", 0.0)
        return child


def swarm_runtime(
    config: SwarmEnvConfig,
    rollout: RolloutConfig,
    env_factory: Callable[[], Env],
    *,
    policy: Any = None,
    custom_env: bool = False,
) -> RaySubagentRuntime:
    """The swarm env's Ray runtime: the pool is keyed by the config (plus the identity of any policy or env factory
    object passed in), so the envs a trainer builds per episode all share one pool."""
    spec = SubagentSpec(
        env_factory=env_factory,
        rollout=rollout,
        policy=policy,
        policy_kind=config.subagent_policy,
        model=config.subagent_model,
        base_url=config.subagent_base_url,
        timeout_s=config.subagent_timeout_s,
    )
    key = ("swarm", config.subagent_policy, config.subagent_model, config.subagent_base_url, config.subagent_env,
           config.corpus, config.tasks, config.subagent_timeout_s, repr(rollout), config.ray_address,
           config.ray_actors, config.ray_cpus_per_actor, id(policy) if policy is not None else None,
           id(env_factory) if custom_env else None)  # fmt: skip
    return RaySubagentRuntime(
        spec, actors=config.ray_actors, address=config.ray_address, cpus_per_actor=config.ray_cpus_per_actor,
        pool_key=key,
    )  # fmt: skip


def _failed(task_id: str, seed: int, error: str) -> Trajectory:
    child = Trajectory(task_id=task_id, env="subagent", seed=seed, truncated=True, trainable=False)
    child.error = error
    return child
