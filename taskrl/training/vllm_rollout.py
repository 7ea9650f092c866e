"""The trainer's vLLM rollout engine (``placement.rollout_policy = "vllm"``): a supervised vLLM server, the
token-in/token-out ``VLLMPolicy`` that samples from it, the LoRA sync that hot-loads each update as a new version,
and the supervision of a step's rollouts.

    engine = VLLMEngine.start(config)             # a local server (or the vLLM at rollout_url), health-checked
    policy, sync = engine.attach(learner, learner_policy, run_dir, run=rollout_loop.run)
    trajectories = await engine.play(play, step=step, ...)   # a server that died under the step: restarted,
                                                              # the step's episodes played again
A dead server's episodes are never scored: the whole step is played again after a restart (an exception from the
rollout), or, where the rollout recorded engine failures per episode (``Trajectory.info["infra_failure"]`` with
source ``engine``), exactly those episodes are replayed by their seeds. Restarts and replays are step metrics.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskrl.env import Env, call_hook, maybe_await
from taskrl.policies.base import InvalidRequestError, PolicyError
from taskrl.policies.vllm import WeightsUnknownError
from taskrl.policies.vllm_server import VLLMServer, VLLMServerError, vllm_server_config
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.training.config import TrainConfig
from taskrl.training.sync import ADAPTERS, WeightSyncError, prune_adapters, save_adapter
from taskrl.types import Task, Trajectory

if TYPE_CHECKING:
    from taskrl.chat import ChatFormat
    from taskrl.policies.hf import HFPolicy
    from taskrl.policies.vllm import VLLMPolicy
    from taskrl.training.learner import Learner

logger = logging.getLogger(__name__)
Runner = Callable[[Coroutine[Any, Any, Any]], Any]
"""Runs a coroutine to completion on the loop the policy's HTTP client belongs to (the trainer's rollout loop)."""


class RolloutEngineError(RuntimeError):
    """The rollout engine stayed down: restarts within one step ran out, or a restart failed."""


def model_dir(model: str) -> str:
    """The directory vLLM loads for ``TrainConfig.model``: the bundled SmolLM2's safetensors cache, or the path."""
    if model == "smollm2":
        from taskrl.policies.models import smollm2_cache_path

        return str(smollm2_cache_path())
    return model


def server_of(config: TrainConfig) -> VLLMServer:
    """The (not yet started) ``VLLMServer`` of a config: the vLLM at ``rollout_url``, or a local one over ``model``."""
    table = dict(config.placement.vllm)
    url = config.placement.rollout_url
    table.setdefault("dtype", config.dtype)  # sample in the learner's weights dtype (auto: the same rule, same CPU)
    if config.finetune == "full":  # each update reloads the served weights in place: no adapters
        table.setdefault("weight_updates", True)
        table.setdefault("enable_lora", False)
    server_config = vllm_server_config(
        table, model="" if url else model_dir(config.model), url=url,
        served_name=config.placement.rollout_model or "base",
        lora_rank=config.lora.rank, max_staleness=config.rollout.max_staleness,
    )  # fmt: skip
    return VLLMServer(server_config)


def chat_format_of(model: str) -> ChatFormat:
    """The learner's chat format for ``TrainConfig.model`` (Ray actors rebuild it from the name)."""
    from transformers import AutoTokenizer

    from taskrl.chat import ChatFormat
    from taskrl.policies.models import smollm2_tokenizer

    if model == "smollm2":
        return ChatFormat(smollm2_tokenizer())
    return ChatFormat(AutoTokenizer.from_pretrained(model, local_files_only=True))


def vllm_policy(
    base_url: str, served_model: str, chat_format: ChatFormat | str, *, max_positions: int, max_staleness: int,
    logprobs_mode: str = "processed_logprobs", adapter_prefix: str | None = None,
) -> VLLMPolicy:
    """A token-mode ``VLLMPolicy`` on the server (``chat_format`` may be a ``TrainConfig.model`` name: a Ray actor
    builds its own); its adapters are named ``<adapter_prefix>-v<version>``."""
    from taskrl.policies.vllm import VLLMPolicy

    if isinstance(chat_format, str):
        chat_format = chat_format_of(chat_format)
    return VLLMPolicy(
        base_url, served_model, chat_format, timeout_s=600.0, max_positions=max_positions,
        max_staleness=max_staleness, logprobs_mode=logprobs_mode, adapter_prefix=adapter_prefix,
    )  # fmt: skip


class VLLMSync:
    """``WeightSync`` into vLLM. LoRA: saves the learner's adapter as ``adapters_dir/v{version}`` and hot-loads it as
    a new version (``VLLMPolicy.load_adapter``: versioned names, stale ones unloaded). Full fine-tuning: saves the
    whole model there and reloads the served weights in place (``VLLMPolicy.load_weights``: in-flight requests
    finish first, the prefix cache is dropped). Before loading it makes sure the server is up; a restarted server
    first gets the version it served back. Failures are ``WeightSyncError``: rollouts keep the previous version."""

    def __init__(self, engine: VLLMEngine, learner: Learner, adapters_dir: Path, run: Runner) -> None:
        self.engine = engine
        self.learner = learner
        self.adapters_dir = adapters_dir
        self.run = run
        # in-place full weights serve one version at a time; the one before stays on disk to restore
        self.keep = 2 if engine.full else learner.config.rollout.max_staleness + 1

    def __call__(self, version: int) -> None:
        policy = self.engine.policy
        if version == policy.version and (version == 0 or self.engine.full or policy.model in policy.adapters):
            return
        try:
            self.run(self.engine.recover())
        except (VLLMServerError, RolloutEngineError, PolicyError) as exc:
            raise WeightSyncError(f"vLLM is down and could not be restarted for version {version}: {exc}") from exc
        if version == 0:  # fresh LoRA adapters are the identity (B = 0): the base model is version 0
            policy.use_base()
            return
        if self.engine.full:
            self._load_full(version)
            return
        path = save_adapter(self.learner, self.adapters_dir, version)
        try:
            self.run(policy.load_adapter(path, version))
        except PolicyError as exc:
            raise WeightSyncError(str(exc)) from exc
        prune_adapters(self.adapters_dir, self.keep, path)

    def _load_full(self, version: int) -> None:
        policy = self.engine.policy
        path = save_adapter(self.learner, self.adapters_dir, version)  # a save_pretrained dir of the whole model
        if self.engine.reload_mode == "restart":
            self._restart_onto(path, version)
            prune_adapters(self.adapters_dir, self.keep, path)
            return
        try:
            self.run(policy.load_weights(path, version, restore=self.engine.weights_of(policy.version)))
        except WeightsUnknownError as exc:
            if not self.engine.server.local:
                raise RolloutEngineError(
                    f"{exc}; the vLLM at {self.engine.server.base_url} was not started by taskrl: restart it there"
                ) from exc
            logger.warning("%s; restarting the vLLM server", exc)
            try:  # a fresh server serves the base weights (version 0); then this version, onto known weights
                self.engine.server.restart()
                policy.use_base()
                self.run(policy.load_weights(path, version))
            except (VLLMServerError, PolicyError) as again:
                raise RolloutEngineError(f"{exc}; restarting the server did not recover it: {again}") from again
        except PolicyError as exc:
            raise WeightSyncError(str(exc)) from exc
        prune_adapters(self.adapters_dir, self.keep, path)

    def _restart_onto(self, path: Path, version: int) -> None:
        """weight_reload=restart: the server restarted on ``path`` (tokenizer beside the weights); one that does not
        come up there is restarted on the previous version's weights, which keep serving (``WeightSyncError``)."""
        policy, server = self.engine.policy, self.engine.server
        policy.chat_format.tokenizer.save_pretrained(str(path))
        previous = self.engine.weights_of(policy.version)
        try:
            server.restart(model=path)
        except VLLMServerError as exc:
            if previous is None:
                why = f"the vLLM server did not start on version {version}'s weights: {exc}"
                raise RolloutEngineError(why) from exc
            try:
                server.restart(model=previous)
            except VLLMServerError as again:
                raise RolloutEngineError(
                    f"the vLLM server did not start on version {version}'s weights ({exc}) nor again on version "
                    f"{policy.version}'s ({again})"
                ) from again
            policy.adapters.clear()
            raise WeightSyncError(
                f"the vLLM server did not start on full weights version {version} from {str(path)!r}: {exc}; "
                f"restarted on version {policy.version}, which keeps serving"
            ) from exc
        policy.adapters.clear()
        policy.use_weights(version)


class VLLMEngine:
    """A ``VLLMServer`` with the policy that samples from it and the supervision of rollouts (see the module)."""

    def __init__(self, server: VLLMServer, config: TrainConfig, *, owns_server: bool) -> None:
        self.server = server
        self.config = config
        self.owns_server = owns_server
        self.full = config.finetune == "full"  # full weights synced (reload_mode) instead of LoRA adapters
        self.reload_mode = "in_place"  # set by ``attach`` once the learner's model is known
        self.policy: VLLMPolicy | Any = None  # set by ``attach``
        self.adapters_dir: Path | None = None
        self._metrics: dict[int, dict[str, float]] = {}

    @classmethod
    def start(cls, config: TrainConfig, server: VLLMServer | None = None) -> VLLMEngine:
        """Start (or reach) the config's server; ``server``: one the caller started and keeps (not stopped here)."""
        owns = server is None
        server = server if server is not None else server_of(config)
        try:
            server.start()
        except VLLMServerError:
            if owns:
                server.stop()
            raise
        return cls(server, config, owns_server=owns)

    def attach(
        self, learner: Learner, learner_policy: HFPolicy, run_dir: str | Path, *, run: Runner
    ) -> tuple[VLLMPolicy, VLLMSync]:
        """The rollout policy (the learner's chat format, so its token ids are the learner's) and its sync. Adapter
        names carry a per-run tag: runs sharing one server (or a resumed run) never collide on a name."""
        self.policy = vllm_policy(
            self.server.base_url, self.server.served_model, learner_policy.chat_format,
            max_positions=self.server.config.max_model_len, max_staleness=self.config.rollout.max_staleness,
            logprobs_mode=self.server.config.logprobs_mode,
            adapter_prefix=f"{self.server.served_model}-{secrets.token_hex(3)}",
        )  # fmt: skip
        self.adapters_dir = Path(run_dir).resolve() / ADAPTERS
        self.reload_mode = reload_mode(self.server, learner.model) if self.full else "in_place"
        return self.policy, VLLMSync(self, learner, self.adapters_dir, run)

    def remote_policy_factory(self) -> Callable[[], Any]:
        """A picklable factory of the same policy for Ray rollout actors (they rebuild the chat format)."""
        return functools.partial(
            vllm_policy, self.server.base_url, self.server.served_model, self.config.model,
            max_positions=self.server.config.max_model_len, max_staleness=self.config.rollout.max_staleness,
            logprobs_mode=self.server.config.logprobs_mode,
        )  # fmt: skip

    # -- supervision ----------------------------------------------------------------------------------
    async def recover(self) -> bool:
        """Make sure the server answers; after a restart load the adapter version the policy served. True when the
        server had to be restarted (or, remote, waited for)."""
        if not await asyncio.to_thread(self.server.ensure_up):
            return False
        policy = self.policy
        policy.adapters.clear()  # a fresh server holds no adapter, and the weights it was started with
        if policy.version > 0 and self.adapters_dir is not None:
            version = policy.version
            if self.full and self.reload_mode == "restart":
                return True  # it was restarted on the directory of the version it served
            if self.full:
                policy.use_base()
                await policy.load_weights(self.adapters_dir / f"v{version}", version)
            else:
                await policy.load_adapter(self.adapters_dir / f"v{version}", version)
        return True

    def weights_of(self, version: int) -> Path | None:
        """The directory holding the full weights of ``version`` (0: the model a local server was started with), or
        None where none is known (a remote server's own model)."""
        if version == 0:
            return self.server.model_dir if self.server.local else None
        path = self.adapters_dir / f"v{version}" if self.adapters_dir is not None else None
        return path if path is not None and path.is_dir() else None

    async def play(
        self,
        play: Callable[[], Awaitable[list[Trajectory]]],
        *,
        step: int,
        episodes: int,
        tasks: Sequence[Task],
        rollout: RolloutConfig,
        env_factory: Callable[[], Env],
    ) -> list[Trajectory]:
        """``play()`` the step's rollouts; when the server died under them, restart it and play them again."""
        restarts = replayed = 0
        limit = self.config.placement.rollout_restarts
        while True:
            try:
                trajectories = await play()
                break
            except InvalidRequestError:
                raise  # the request was wrong, not the server
            except Exception as exc:
                if await asyncio.to_thread(self.server.alive):
                    raise  # the server is fine: an error of the rollout itself
                self._check_budget(step, restarts, limit, exc)
                await self._restart(step, f"{type(exc).__name__}: {_first_line(exc)}", episodes)
                restarts, replayed = restarts + 1, replayed + episodes
        by_id = {task.id: task for task in tasks}
        while True:  # engine failures recorded per episode: replay exactly those, by their seeds
            failed = [i for i, t in enumerate(trajectories) if _engine_failure(t) is not None]
            if not failed or await asyncio.to_thread(self.server.alive):
                break  # failures of a server that is up stay infrastructure failures (dropped, not scored)
            first = _engine_failure(trajectories[failed[0]]) or ""
            self._check_budget(step, restarts, limit, RuntimeError(first))
            await self._restart(step, first, len(failed))
            restarts, replayed = restarts + 1, replayed + len(failed)
            again = await asyncio.gather(
                *(_replay(env_factory, self.policy, by_id[trajectories[i].task_id], rollout, trajectories[i])
                  for i in failed)
            )  # fmt: skip
            for i, trajectory in zip(failed, again, strict=True):
                trajectories[i] = trajectory
        self._metrics[step] = {"charts/rollout_restarts": float(restarts), "charts/rollout_replayed": float(replayed)}
        return trajectories

    def step_metrics(self, step: int) -> dict[str, float]:
        """Restarts of the server and episodes played again during ``step``'s rollouts."""
        return self._metrics.pop(step, {"charts/rollout_restarts": 0.0, "charts/rollout_replayed": 0.0})

    def _check_budget(self, step: int, restarts: int, limit: int, cause: BaseException) -> None:
        if restarts >= limit:
            raise RolloutEngineError(
                f"step {step}: the vLLM server at {self.server.base_url} went down during the rollouts after "
                f"{restarts} restart(s) this step (placement.rollout_restarts={limit}); last error: "
                f"{_first_line(cause)}; its log ({self.server.log_path}) ends:\n{self.server.log_tail()}"
            ) from cause

    async def _restart(self, step: int, why: str, episodes: int) -> None:
        logger.warning("step %d: the vLLM server at %s is down (%s); restarting it and playing %d episode(s) again",
                       step, self.server.base_url, why, episodes)  # fmt: skip
        await self.recover()

    def close(self) -> None:
        """Stop the server if this engine started it."""
        if self.owns_server:
            self.server.stop()


def reload_mode(server: VLLMServer, model: Any) -> str:
    """How full weights reach ``server`` (``VLLMServerConfig.weight_reload``; "auto" resolved): restart for a local
    server whose model ties its input and output embeddings and trains them, in_place otherwise (and always for a
    server taskrl cannot restart)."""
    chosen = server.config.weight_reload
    if chosen != "auto":
        if chosen == "restart" and not server.local:
            raise ValueError("weight_reload='restart' needs a local vLLM server: taskrl cannot restart a remote one")
        return chosen
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    tied = bool(getattr(getattr(inner, "config", None), "tie_word_embeddings", False))
    embedding = inner.get_input_embeddings() if hasattr(inner, "get_input_embeddings") else None
    trained = embedding is not None and embedding.weight.requires_grad
    return "restart" if server.local and tied and trained else "in_place"


def _engine_failure(trajectory: Trajectory) -> str | None:
    """The detail of an engine failure the rollout recorded on this episode (``info["infra_failure"]``), else None."""
    failure = trajectory.info.get("infra_failure")
    if isinstance(failure, dict) and failure.get("source") == "engine":
        return str(failure.get("detail", "engine failure"))
    return None


async def _replay(
    env_factory: Callable[[], Env], policy: Any, task: Task, rollout: RolloutConfig, failed: Trajectory
) -> Trajectory:
    """The failed episode played again: same task, seed and group, a fresh env (closed after, as in run_episodes)."""
    env = env_factory()
    try:
        return await run_episode(env, policy, task, rollout, seed=failed.seed, group_id=failed.group_id)
    finally:
        await maybe_await(call_hook(env, "close"))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
