"""Weight sync: after each update, make the rollout policy sample from the learner's weights, tagged with a version.

``InProcessSync`` (the rollout policy holds the learner's model: only the version moves), ``CopySync`` (the
rollout policy holds its own copy, so rollouts can run while the learner changes its weights) and
``ServerLoRASync`` (LoRA adapters pushed to an OpenAI-compatible server with ``/v1/load_lora_adapter``; into a
``VLLMPolicy``'s server through the policy, which names, loads and prunes its own versions).
``rollout_setup(config, learner, learner_policy, run_dir)`` builds the rollout policy and its sync from a config.

From a sharded (fsdp2) learner, ``CopySync`` gathers one parameter at a time and copies it into the rank's own
rollout copy: beyond the copy itself (the one full model per rank that decodes), a sync holds one gathered
parameter at once. A non-finite adapter is never pushed to a server (``WeightSyncError``).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import torch

from taskrl.policies.base import PolicyError
from taskrl.policies.hf import HFPolicy
from taskrl.policies.openai import OpenAIPolicy
from taskrl.policies.vllm import VLLMPolicy
from taskrl.training.config import ConfigError, TrainConfig
from taskrl.training.model import is_peft

if TYPE_CHECKING:
    from taskrl.training.learner import Learner

ADAPTERS = "adapters"
"""Run-directory folder of the adapters pushed to a rollout server (``v{version}`` each)."""


logger = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A sync did not reach the rollout policy; it keeps sampling the previous version (the message is one line)."""


class WeightSync(Protocol):
    """Makes the rollout policy sample from the learner's weights at ``version`` (later samples carry it).

    A sync is built with whatever it reads from (the learner, its model) and called after every update and
    after a resume. Raising ``WeightSyncError`` means "not synced, try again next time": the trainer logs it
    and carries on; the rollout policy must then still be on an older, consistently tagged version.
    """

    def __call__(self, version: int) -> None: ...


class InProcessSync:
    """The rollout policy holds the learner's model object: nothing to copy, only the version to bump."""

    def __init__(self, policy: Any, model: Any) -> None:
        if not isinstance(policy, HFPolicy) or policy.model is not model:
            raise ValueError(
                "the rollout policy does not hold the learner's model; pass a weight_sync that pushes weights "
                "to it (e.g. LoRA adapters to a server)"
            )
        self.policy = policy

    def __call__(self, version: int) -> None:
        self.policy.version = version


def rollout_copy(policy: HFPolicy, dtype: torch.dtype | None = None) -> HFPolicy:
    """A second ``HFPolicy`` on a deep copy of ``policy.model`` (same peft adapter structure, same device), its
    weights cast to ``dtype`` when given (a bf16 rollout of an fp32 learner). Take it before the learner shards
    the model (fsdp2): the copy must be whole."""
    model = copy.deepcopy(policy.model).requires_grad_(False)
    if dtype is not None:
        model = model.to(dtype)
    return HFPolicy(
        model,
        policy.tokenizer,
        name=f"{policy.name}-rollout",
        device=None,
        chat_format=policy.chat_format,
        engine_config=policy.engine_config,
    )


class CopySync:
    """Copies the learner's trainable tensors (LoRA adapters, or every unfrozen weight) into the rollout copy."""

    def __init__(self, learner: Learner, policy: HFPolicy) -> None:
        self.learner = learner
        self.policy = policy
        targets = dict(policy.model.named_parameters())
        names = [n for n in learner.trainable_state() if not n.startswith("value_head.")]
        missing = [n for n in names if n not in targets]
        if missing:
            raise ValueError(
                f"the rollout model has no parameter {missing[0]!r} (and {len(missing) - 1} more); build it "
                "with taskrl.training.sync.rollout_copy(learner_policy) after the model was prepared (LoRA-wrapped)"
            )
        self.targets = {n: targets[n] for n in names}

    def __call__(self, version: int) -> None:
        def copy_in() -> None:
            with torch.no_grad():
                # One whole tensor at a time (an all-gather per parameter when the learner is sharded; every rank
                # syncs its own copy, so all ranks gather in the same order).
                for name, full in self.learner.gathered_state():
                    target = self.targets.get(name)
                    if target is not None:
                        target.copy_(full)
            self.policy.version = version

        # between two decode batches: the policy's single decode thread reads ``version`` when a batch starts, so
        # no batch ever mixes old and new weights
        self.policy.run_exclusive(copy_in)


class ServerLoRASync:
    """Saves the learner's LoRA adapter under ``adapters_dir/v{version}``, loads it into the rollout server as a
    new model (``/v1/load_lora_adapter``, vLLM's convention) and points the ``OpenAIPolicy`` at it.

    The adapter path must be readable by the server (same machine or shared storage), as with vLLM. Adapter
    names carry a per-sync random tag so a resumed run never collides with adapters an earlier run loaded.
    Only the newest ``keep`` adapter directories stay on disk and loaded on the server: older ones are unloaded
    (``/v1/unload_lora_adapter``), so a long run does not grow the server by one model per update. Syncs run when
    no rollout is in flight, and the previous adapter stays loaded for anything still holding its name. A
    ``VLLMPolicy`` loads each version itself (``load_adapter``: versioned names, ``keep = max_staleness + 1``).
    """

    def __init__(
        self,
        learner: Learner,
        policy: OpenAIPolicy,
        *,
        adapters_dir: str | Path,
        base_model: str,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        keep: int = 2,
    ) -> None:
        if not is_peft(learner.model):
            raise ValueError("ServerLoRASync pushes LoRA adapters: train with finetune='lora'")
        if keep < 1:
            raise ValueError(f"ServerLoRASync.keep must be >= 1, got {keep}")
        self.learner = learner
        self.policy = policy
        self.adapters_dir = Path(adapters_dir).resolve()
        self.base_model = base_model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.keep = keep
        self.tag = secrets.token_hex(3)
        self.url = f"{policy.base_url}/load_lora_adapter"
        self.unload_url = f"{policy.base_url}/unload_lora_adapter"
        self.loaded: list[str] = []  # adapters this sync loaded and has not unloaded, oldest first
        if isinstance(policy, VLLMPolicy):  # the policy keeps the books; the tag keeps a resumed run's names new
            policy.adapter_prefix = f"{base_model}-{self.tag}"
            policy.max_staleness = keep - 1

    def adapter_name(self, version: int) -> str:
        return f"{self.base_model}-{self.tag}-v{version}"

    def __call__(self, version: int) -> None:
        if version == self.policy.version:
            return
        if version == 0:  # fresh LoRA adapters are the identity (B = 0): the base model is version 0
            self.policy.model = self.base_model
            self.policy.set_version(0)
            return
        path = self._save(version)
        if isinstance(self.policy, VLLMPolicy):
            self._load_into_vllm(self.policy, path, version)
            self._prune(path)
            return
        name = self.adapter_name(version)
        self._post({"lora_name": name, "lora_path": str(path), "base_model": self.base_model})
        # Name first, then version: a request racing the switch is tagged older than its weights, never newer.
        self.policy.model = name
        self.policy.set_version(version)
        self.loaded.append(name)
        self._prune(path)
        self._unload_old()

    def _load_into_vllm(self, policy: VLLMPolicy, path: Path, version: int) -> None:
        """``policy.load_adapter`` on a loop of its own (the trainer's thread has none; the rollout loop is busy)."""

        async def load() -> None:
            try:
                await policy.load_adapter(path, version)
            finally:
                await policy.aclose()  # this loop's connections: the loop ends here

        try:
            _run_blocking(load)
        except PolicyError as exc:
            raise WeightSyncError(_one_line(str(exc))) from exc
        self.loaded = list(policy.adapters)

    def _unload_old(self) -> None:
        """Unload adapters beyond the newest ``keep``; a failure only warns (the switch itself succeeded)."""
        while len(self.loaded) > self.keep:
            name = self.loaded.pop(0)
            try:
                self._post({"lora_name": name}, url=self.unload_url, then=f"adapter {name} stays loaded on the server")
            except WeightSyncError as exc:
                logger.warning("%s", exc)  # the switch to the new adapter succeeded: only memory is at stake

    def _save(self, version: int) -> Path:
        return save_adapter(self.learner, self.adapters_dir, version)

    def _post(
        self,
        body: dict[str, Any],
        *,
        url: str | None = None,
        then: str = "rollouts keep the previous adapter, the next sync retries",
    ) -> None:
        """POST ``body``; any failure is a one-line ``WeightSyncError`` naming the URL and ``then`` (what happens)."""
        url = url or self.url
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise WeightSyncError(
                f"weight sync to {url} failed ({type(exc).__name__}: {_one_line(str(exc))}); is the server up? {then}"
            ) from exc
        if response.status_code >= 400:
            raise WeightSyncError(
                f"weight sync to {url} failed: HTTP {response.status_code}: {_server_message(response)}; {then}"
            )

    def _prune(self, current: Path) -> None:
        prune_adapters(self.adapters_dir, self.keep, current)


def save_adapter(learner: Learner, adapters_dir: Path, version: int) -> Path:
    """The learner's LoRA adapter as ``adapters_dir/v{version}``, written atomically (a killed run never leaves half
    an adapter to load); non-finite weights are refused with ``WeightSyncError``."""
    from taskrl.training.checkpoint import NonFiniteWeightsError, check_finite

    try:
        check_finite(learner, f"adapter v{version} for the rollout server")
    except NonFiniteWeightsError as exc:
        raise WeightSyncError(f"{exc}; rollouts keep the previous adapter") from exc
    adapters_dir.mkdir(parents=True, exist_ok=True)
    final = adapters_dir / f"v{version}"
    tmp = adapters_dir / f".tmp-v{version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    learner.model.save_pretrained(str(tmp))
    if final.exists():  # a resumed run re-saves the version it restored
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def prune_adapters(adapters_dir: Path, keep: int, current: Path) -> None:
    """Delete all but the newest ``keep`` adapter directories (never ``current``)."""
    versions = sorted(int(p.name[1:]) for p in adapters_dir.glob("v*") if p.is_dir() and p.name[1:].isdigit())
    for old in versions[:-keep]:
        if adapters_dir / f"v{old}" != current:
            shutil.rmtree(adapters_dir / f"v{old}", ignore_errors=True)


def connect_server(config: TrainConfig, *, timeout_s: float = 10.0) -> OpenAIPolicy:
    """The rollout ``OpenAIPolicy`` of ``rollout_policy='server'``, after checking the server serves the model."""

    api_key = os.environ.get(config.placement.rollout_api_key_env) or None
    url = config.placement.rollout_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"placement.rollout_url: cannot reach {url}/models ({type(exc).__name__}); start the server "
            "(`taskrl serve ...`, vLLM with --enable-lora) or fix the URL"
        ) from None
    if response.status_code >= 400:
        raise ConfigError(f"placement.rollout_url: {url}/models returned HTTP {response.status_code}")
    try:
        served = [str(m["id"]) for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"placement.rollout_url: {url}/models is not an OpenAI model list") from None
    if config.placement.rollout_model not in served:
        raise ConfigError(
            f"placement.rollout_model: {config.placement.rollout_model!r} is not served at {url} "
            f"(served: {', '.join(served)})"
        )
    return OpenAIPolicy(url, config.placement.rollout_model, api_key=api_key, timeout_s=600.0)


def rollout_setup(
    config: TrainConfig,
    learner: Learner,
    learner_policy: HFPolicy,
    run_dir: str | Path,
    *,
    server_policy: OpenAIPolicy | None = None,
    copy_policy: HFPolicy | None = None,
) -> tuple[HFPolicy | OpenAIPolicy, WeightSync]:
    """The rollout policy of ``config.placement.rollout_policy`` and the sync that feeds it the learner's weights
    (``copy_policy``: the rollout copy, taken before the learner was built, e.g. by ``rollout_copy``)."""
    if config.placement.rollout_policy == "inprocess":
        return learner_policy, InProcessSync(learner_policy, learner.model)
    if config.placement.rollout_policy == "copy":
        rollout = copy_policy if copy_policy is not None else rollout_copy(learner_policy)
        return rollout, CopySync(learner, rollout)
    policy = server_policy if server_policy is not None else connect_server(config)
    sync = ServerLoRASync(
        learner, policy, adapters_dir=Path(run_dir) / ADAPTERS, base_model=config.placement.rollout_model,
        api_key=policy.api_key,
    )  # fmt: skip
    return policy, sync


def _run_blocking(work: Any) -> Any:
    """``asyncio.run(work())`` here, or on a helper thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskrl-sync") as pool:
        return pool.submit(asyncio.run, work()).result()


def _server_message(response: httpx.Response) -> str:
    """The server's error text (OpenAI ``{"error": {"message"}}``, FastAPI ``detail``) on one line."""
    try:
        body = response.json()
    except ValueError:
        return _one_line(response.text[:300]) or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return _one_line(str(error["message"])[:300])
    if isinstance(body, dict) and body.get("detail"):
        return _one_line(str(body["detail"])[:300])
    return _one_line(str(body)[:300])


def _one_line(text: str) -> str:
    return " ".join(text.split())
