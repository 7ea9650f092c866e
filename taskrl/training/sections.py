"""The sections of ``TrainConfig`` (``taskrl.training.config``), each a dataclass that validates itself with errors
naming the dotted key: ``RolloutSettings`` (``[rollout]``), ``PlacementConfig`` (``[placement]``) and ``LoraConfig``
(``[lora]``); the ``[algo]`` section is each algorithm's own dataclass in ``taskrl/algos``. Also ``ConfigError``
and the choices the config's string fields take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from taskrl import context
from taskrl.validate import finite_at_least, integer_at_least, require

KL_MODES = ("none", "k1_reward", "k3_loss")
FINETUNE_MODES = ("full", "lora")
DTYPES = ("float32", "bfloat16", "float16", "auto")
ROLLOUT_POLICIES = ("inprocess", "copy", "server", "vllm")
DIST_BACKENDS = ("auto", "gloo", "nccl")
LEARNER_BACKENDS = ("ddp", "fsdp2")
LEARNER_PRECISIONS = ("float32", "bfloat16", "auto")
ROLLOUT_DTYPES = ("same", "float32", "bfloat16", "auto")
SPLITS = ("train", "val", "test", "all")
"""The task splits envs share (``Env.tasks(split)``); a typo such as 'valid' would silently read as a train split."""


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


def need(ok: bool, what: str, **field: Any) -> None:
    """``field`` is the one (dotted) field the error names, with its value: ``need(ok, "must be ...", kl=kl)``."""
    if not ok:
        ((name, value),) = field.items()
        raise ConfigError(f"{name.replace('__', '.') if '__' in name else f'TrainConfig.{name}'} {what}, got {value!r}")


def one_of(value: str, choices: tuple[str, ...], name: str) -> None:
    need(value in choices, f"must be one of {', '.join(choices)}", **{name.replace(".", "__"): value})


@dataclass
class RolloutSettings:
    """``[rollout]``: what each step plays (tasks, samples, episode budgets, sampling, staleness)."""

    tasks_per_step: int = 8
    """Tasks per step; each is played group_size times."""
    group_size: int = 8
    """Episodes per task (K); GRPO, CISPO and Kimi need K >= 2."""
    max_turns: int = 4
    """Assistant turns per episode."""
    max_context_tokens: int = 2048
    """Tokens in the model's context per episode."""
    max_new_tokens: int = 128
    """Tokens sampled per turn."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Context compaction at a token trigger: a table of ``taskrl.context.SummaryConfig`` fields, e.g.
    ``{trigger_tokens = 400, mode = "self"}`` (mode=self trains the summaries on the episode reward); {} = off."""
    temperature: float = 1.0
    """Sampling temperature; the learner scores tokens at the same temperature, so the first ratio is 1."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    concurrency: int = 32
    """Episodes in flight at once (they are decoded in one batch)."""
    async_rollout: bool = False
    """Play step k+1's episodes while the learner updates on step k's (needs rollout_policy copy, server or vllm)."""
    max_staleness: int = 2
    """Samples whose policy version is more than this behind the learner are dropped."""

    def __post_init__(self) -> None:
        require("rollout", "must be an integer >= 1", integer_at_least(1), error=ConfigError,
                tasks_per_step=self.tasks_per_step, group_size=self.group_size, max_turns=self.max_turns,
                max_context_tokens=self.max_context_tokens, max_new_tokens=self.max_new_tokens,
                concurrency=self.concurrency)  # fmt: skip
        require("rollout", "must be an integer >= 0", integer_at_least(0), error=ConfigError,
                max_staleness=self.max_staleness)  # fmt: skip
        require("rollout", "must be >= 0", finite_at_least(0), error=ConfigError, temperature=self.temperature)
        need(0 < self.top_p <= 1, "must be in (0, 1]", rollout__top_p=self.top_p)
        try:
            compaction = context.from_value(self.summary, "rollout.summary")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        need(compaction is None or compaction.trigger_tokens < self.max_context_tokens,
              f"trigger_tokens must be below rollout.max_context_tokens ({self.max_context_tokens})",
              rollout__summary=self.summary)  # fmt: skip


@dataclass
class PlacementConfig:
    """``[placement]``: where the run executes: learner processes and backends, Ray actors, the rollout engine."""

    nproc: int = 1
    """Data-parallel learner processes (torch.distributed): each plays its share of a step's tasks, gradients are
    summed over all of them; > 1 needs device auto, cpu or cuda (one GPU per local rank)."""
    dist_backend: str = "auto"
    """torch.distributed backend of nproc > 1: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""
    learner_backend: str = "ddp"
    """nproc > 1: ddp (every rank holds the whole model and optimizer, gradients all-reduced) or fsdp2 (FSDP2
    shards parameters, gradients and AdamW state over the ranks; checkpoints are sharded torch.distributed.checkpoint
    directories, resumable on any number of ranks). fsdp2 with nproc > 1 needs rollout_policy='copy'."""
    ray: bool = False
    """Play rollouts in Ray actors, each with its own policy copy and envs (same seeds, same samples as local)."""
    ray_address: str = ""
    """Ray cluster with ray=true: "" starts a local Ray, "auto" or "ray://host:port" connects to a running one."""
    ray_workers: int = 2
    """Rollout actors with ray=true; each step's task groups are dealt across them."""
    ray_num_cpus_per_worker: float = 1.0
    """CPUs Ray reserves for each rollout actor."""
    ray_num_gpus_per_worker: float = 0.0
    """GPUs Ray reserves for each rollout actor (fractions share one); device=auto uses CUDA only when one is held."""
    rollout_policy: str = "inprocess"
    """Who samples: inprocess (the learner's model), copy (its own model copy, synced after each update), server
    (an OpenAI-compatible server at rollout_url; each update's LoRA adapter is pushed to it) or vllm (vLLM, token
    in and token out: a local server taskrl starts and supervises from ``model``, or the vLLM at rollout_url; each
    update's LoRA adapter is hot-loaded as a new version; a server that dies mid-step is restarted and the step's
    episodes played again, never scored as failures)."""
    rollout_url: str = ""
    """rollout_policy=server: the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1; rollout_policy=vllm:
    a vLLM started elsewhere (a cluster's; health-checked, not restarted), "" = start a local one."""
    rollout_model: str = ""
    """rollout_policy=server, or vllm with rollout_url: the served base model's name; the adapters apply to it."""
    rollout_dtype: str = "same"
    """Weights dtype of the rollout copy (rollout_policy='copy'): same (as dtype), float32, bfloat16 or auto (as
    learner_precision's auto). The sampler/learner logprob gap is logged as losses/mismatch_kl and corrected by the
    truncated importance weights."""
    vllm: dict[str, Any] = field(default_factory=dict)
    """rollout_policy=vllm: the local server's settings, a table of ``taskrl.policies.vllm_server.VLLMServerConfig``
    fields, e.g. ``{threads = "0-1", kv_cache_gib = 2, max_model_len = 2048, port = 0}`` (its model is ``model``,
    its LoRA rank limit follows ``lora_rank``); the vLLM virtualenv is ``make vllm-setup``'s ``.venv-vllm``."""
    rollout_restarts: int = 2
    """rollout_policy=vllm: restarts of a dead server within one step before the step fails (0: fail at once)."""
    rollout_api_key_env: str = "TASKRL_ROLLOUT_API_KEY"
    """rollout_policy=server: environment variable holding the server's API key (admin rights load adapters)."""

    def __post_init__(self) -> None:
        require("placement", "must be an integer >= 1", integer_at_least(1), error=ConfigError,
                nproc=self.nproc, ray_workers=self.ray_workers)  # fmt: skip
        require("placement", "must be an integer >= 0", integer_at_least(0), error=ConfigError,
                rollout_restarts=self.rollout_restarts)  # fmt: skip
        require("placement", "must be >= 0", finite_at_least(0), error=ConfigError,
                ray_num_cpus_per_worker=self.ray_num_cpus_per_worker,
                ray_num_gpus_per_worker=self.ray_num_gpus_per_worker)  # fmt: skip
        one_of(self.rollout_policy, ROLLOUT_POLICIES, "placement.rollout_policy")
        one_of(self.learner_backend, LEARNER_BACKENDS, "placement.learner_backend")
        one_of(self.rollout_dtype, ROLLOUT_DTYPES, "placement.rollout_dtype")
        one_of(self.dist_backend, DIST_BACKENDS, "placement.dist_backend")
        need(not (self.ray and self.rollout_policy == "copy"),
              "must not be 'copy' with ray=true: the Ray actors already sample from their own copies",
              placement__rollout_policy=self.rollout_policy)  # fmt: skip
        server = self.rollout_policy == "server"
        need(not server or self.rollout_url.startswith(("http://", "https://")),
              "must be the server's http(s) base URL with rollout_policy=server",
              placement__rollout_url=self.rollout_url)  # fmt: skip
        need(not server or bool(self.rollout_model), "must name the served base model (server)",
              placement__rollout_model=self.rollout_model)  # fmt: skip
        need(not self.vllm or self.rollout_policy == "vllm",
              "is the vLLM server's table: set placement.rollout_policy='vllm'", placement__vllm=self.vllm)
        need(self.rollout_dtype == "same" or self.rollout_policy == "copy",
              "must be 'same' unless rollout_policy='copy' (the in-process rollout samples the learner's own "
              "weights; a server or Ray actors load their own)", placement__rollout_dtype=self.rollout_dtype)
        need(self.learner_backend != "fsdp2" or self.nproc == 1 or self.rollout_policy == "copy",
              "'fsdp2' with nproc > 1 needs rollout_policy='copy': a sharded model cannot decode on one rank "
              "alone, each rank samples from its own full copy",
              placement__learner_backend=self.learner_backend)  # fmt: skip
        need(self.nproc == 1 or not self.ray, "must be 1 with ray=true (Ray rollouts feed one learner)",
              placement__nproc=self.nproc)  # fmt: skip
        need(self.nproc == 1 or self.rollout_policy not in ("server", "vllm"),
              f"must be 1 with rollout_policy={self.rollout_policy!r} (every rank would load the same adapter)",
              placement__nproc=self.nproc)  # fmt: skip
        need(self.ray_address in ("", "auto") or self.ray_address.startswith(("ray://", "http://"))
              or ":" in self.ray_address, 'must be "", "auto", "ray://host:port" or "host:port"',
              placement__ray_address=self.ray_address)  # fmt: skip
        if self.rollout_policy == "vllm":
            need(not self.rollout_url or self.rollout_url.startswith(("http://", "https://")),
                  "must be a vLLM's http(s) base URL, or \"\" to start a local one",
                  placement__rollout_url=self.rollout_url)  # fmt: skip
            need(not self.rollout_url or bool(self.rollout_model),
                  "must name the served base model when rollout_url points at a vLLM",
                  placement__rollout_model=self.rollout_model)  # fmt: skip


@dataclass
class LoraConfig:
    """``[lora]``: the adapters of ``finetune = "lora"``."""

    rank: int = 16
    """LoRA rank r."""
    alpha: float = 32.0
    """LoRA scaling alpha (effective scale alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA input; > 0 makes the first-update ratio differ from 1."""
    targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get LoRA adapters."""

    def __post_init__(self) -> None:
        require("lora", "must be an integer >= 1", integer_at_least(1), error=ConfigError, rank=self.rank)
        require("lora", "must be >= 0", finite_at_least(0), error=ConfigError, alpha=self.alpha)
        need(0 <= self.dropout < 1, "must be in [0, 1)", lora__dropout=self.dropout)
        need(bool(self.targets), "must name at least one module", lora__targets=self.targets)
