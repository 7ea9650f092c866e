"""TrainConfig: the one flat config of ``taskrl train``, validated at start, loaded from TOML plus overrides.

    config = load_config("recipes/grpo_smollm2_lora.toml", ["lr=1e-4", "steps=20"])

Overrides are ``field=value`` with a TOML value (``lr=1e-4``, ``env="shop"``, ``lora_targets=["q_proj"]``,
``lr={kind="cosine", start=3e-5, end=1e-6, steps=100}``); a bare word is taken as a string. Unknown keys and
bad values fail before anything runs, naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrl import context
from taskrl.algos import ALGORITHMS
from taskrl.algos.schedules import make_schedule
from taskrl.validate import did_you_mean, finite_at_least, integer_at_least, require

KL_MODES = ("none", "k1_reward", "k3_loss")
FINETUNE_MODES = ("full", "lora")
DTYPES = ("float32", "bfloat16", "float16")
ROLLOUT_POLICIES = ("inprocess", "copy", "server", "vllm")
DIST_BACKENDS = ("auto", "gloo", "nccl")
LEARNER_BACKENDS = ("ddp", "fsdp2")
LEARNER_PRECISIONS = ("float32", "bfloat16", "auto")
ROLLOUT_DTYPES = ("same", "float32", "bfloat16", "auto")
_SCHEDULE_FIELDS = ("lr", "sft_lr", "entropy_coef")
SPLITS = ("train", "val", "test", "all")
"""The task splits envs share (``Env.tasks(split)``); a typo such as 'valid' would silently read as a train split."""


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


@dataclass
class TrainConfig:
    """Everything a training run does; the run is reproducible from this and nothing else."""

    # -- run -----------------------------------------------------------------------------------------
    run_dir: str = "runs/train"
    """Run directory (config, metrics, trajectories, checkpoints); a rerun resumes from its last checkpoint."""
    seed: int = 0
    """Root seed: task order, rollout sampling, minibatch shuffles and initial weights of new heads."""
    steps: int = 100
    """Training steps (each: collect, score, update, sync, log); SFT warm-up steps count."""
    resume: bool = True
    """Resume from the run directory's latest checkpoint when there is one; False refuses a non-empty run_dir."""
    checkpoint_every: int = 10
    """Steps between checkpoints (the last step is always checkpointed); 0 = only at the end."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (oldest deleted first)."""
    log_trajectories: bool = True
    """Write every step's trajectories to run_dir/trajectories/train_STEP.jsonl."""
    progress: bool = True
    """Show a progress bar with ETA on the terminal (one line per step when not a terminal)."""
    log_backends: list[str] = field(default_factory=list)
    """Mirrors of the JSONL metrics: any of tensorboard, wandb, mlflow (pip install 'taskrl[observability]')."""
    device: str = "auto"
    """auto (CUDA when present), cpu, cuda, cuda:1 ..."""
    nproc: int = 1
    """Data-parallel learner processes (torch.distributed): each plays its share of a step's tasks, gradients are
    summed over all of them; > 1 needs device auto, cpu or cuda (one GPU per local rank)."""
    dist_backend: str = "auto"
    """torch.distributed backend of nproc > 1: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""
    learner_backend: str = "ddp"
    """nproc > 1: ddp (every rank holds the whole model and optimizer, gradients all-reduced) or fsdp2 (FSDP2
    shards parameters, gradients and AdamW state over the ranks; checkpoints are sharded torch.distributed.checkpoint
    directories, resumable on any number of ranks). fsdp2 with nproc > 1 needs rollout_policy='copy'."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (less memory, about
    one more forward of compute); exact, and compatible with the shared-prompt KV path."""

    # -- model ---------------------------------------------------------------------------------------
    model: str = "smollm2"
    """'smollm2' (bundled SmolLM2-135M-Instruct), a local save_pretrained directory, or a trained run directory
    or LoRA adapter (merged onto its recorded base): training continues from a trained policy."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16 (the learner's master weights and optimizer math)."""
    learner_precision: str = "float32"
    """Compute dtype of the learner's forward/backward: float32, bfloat16 (torch.autocast over fp32 master weights;
    logprobs and losses stay float32) or auto (bfloat16 only where the hardware accelerates it: CUDA with bf16
    support, a CPU with amx_bf16/avx512_bf16; else float32). The choice is printed at start."""
    rollout_dtype: str = "same"
    """Weights dtype of the rollout copy (rollout_policy='copy'): same (as dtype), float32, bfloat16 or auto (as
    learner_precision's auto). The sampler/learner logprob gap is logged as losses/mismatch_kl and corrected by the
    truncated importance weights."""
    finetune: str = "lora"
    """full (every parameter not matched by ``freeze``) or lora (peft adapters; the base stays frozen)."""
    lora_rank: int = 16
    """LoRA rank r."""
    lora_alpha: float = 32.0
    """LoRA scaling alpha (effective scale alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input; > 0 makes the first-update ratio differ from 1."""
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get LoRA adapters."""
    freeze: list[str] = field(default_factory=list)
    """Regular expressions of parameter names kept frozen in full fine-tuning (e.g. 'embed_tokens')."""

    # -- env and rollout -----------------------------------------------------------------------------
    env: str = "shop"
    """Registered env name (see `taskrl env list`), "my_module:MyEnv" / "my_module:make_env", or an installed
    package's ``taskrl.envs`` entry point (``taskrl.env.make``)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env's constructor."""
    tasks: str = ""
    """Your tasks for the env's tools and reward: a JSONL file (id, prompt, answer, split columns), a datasets
    save_to_disk directory or hf:NAME (``taskrl.task_files``); "" = the env's own tasks."""
    task_columns: dict[str, str] = field(default_factory=dict)
    """Column names of ``tasks`` when they differ, e.g. {prompt = "question", answer = "label"}."""
    split: str = "train"
    """Task split to train on: train, val, test or all."""
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
    vllm: dict[str, Any] = field(default_factory=dict)
    """rollout_policy=vllm: the local server's settings, a table of ``taskrl.policies.vllm_server.VLLMServerConfig``
    fields, e.g. ``{threads = "0-1", kv_cache_gib = 2, max_model_len = 2048, port = 0}`` (its model is ``model``,
    its LoRA rank limit follows ``lora_rank``); the vLLM virtualenv is ``make vllm-setup``'s ``.venv-vllm``."""
    rollout_restarts: int = 2
    """rollout_policy=vllm: restarts of a dead server within one step before the step fails (0: fail at once)."""
    rollout_api_key_env: str = "TASKRL_ROLLOUT_API_KEY"
    """rollout_policy=server: environment variable holding the server's API key (admin rights load adapters)."""
    async_rollout: bool = False
    """Play step k+1's episodes while the learner updates on step k's (needs rollout_policy copy, server or vllm)."""

    # -- algorithm -----------------------------------------------------------------------------------
    algo: str = "grpo"
    """A name in ``taskrl.algos.ALGORITHMS``: grpo, ppo (value head + GAE), cispo, kimi (K2.5 token masking), sft."""
    lr: float | dict[str, Any] = 1e-5
    """Learning rate of RL (or algo=sft) steps: a number or a schedule such as {kind="cosine", ...}."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient norm clip; 0 disables clipping (the norm is still logged)."""
    epochs_per_batch: int = 1
    """Passes over each step's samples."""
    minibatches: int = 1
    """Optimizer steps per pass; > 1 (or epochs > 1) scores the batch once before updating (old logprobs)."""
    micro_batch_tokens: int = 4096
    """Token budget of one forward/backward (shared prefixes counted once, padding counted); bounds memory."""
    normalize_std: bool = False
    """Divide group-relative advantages by the group's std (original GRPO); off = Dr. GRPO."""
    drop_zero_variance: bool = True
    """Drop groups whose rewards are all equal (no signal) before the update."""
    dynamic_sampling: bool = False
    """Group-relative RL steps: drop groups whose rewards are all equal and play more tasks until tasks_per_step
    groups with signal are in hand (DAPO's dynamic sampling; ``taskrl.training.filters``), logged as
    charts/dynamic_* (rounds, groups drawn, dropped, trimmed)."""
    dynamic_sampling_max_rounds: int = 3
    """dynamic_sampling: extra collection rounds a step may play at most (0 = only drop the flat groups)."""
    overlong_filter: bool = False
    """RL steps: episodes cut off by the token budget (max_new_tokens or max_context_tokens) get no loss (DAPO's
    overlong filtering); their rewards still count in their group's mean; counted in charts/overlong_filtered."""
    clip_eps_low: float = 0.2
    """PPO/GRPO ratio clip below 1."""
    clip_eps_high: float = 0.2
    """PPO/GRPO ratio clip above 1 (DAPO's clip-higher uses 0.28)."""
    cispo_eps_low: float = 1.0
    """CISPO IS-weight clip below 1 (1.0 = no lower bound)."""
    cispo_eps_high: float = 2.0
    """CISPO IS-weight clip above 1."""
    kimi_alpha: float = -math.log(2.0)
    """Kimi masking: tokens whose log-ratio is below this get no gradient."""
    kimi_beta: float = math.log(2.0)
    """Kimi masking: tokens whose log-ratio is above this get no gradient."""
    kimi_tau: float = 0.0
    """Kimi: weight of the tau * log-ratio^2 regulariser."""
    gamma: float = 1.0
    """PPO: per-token discount."""
    gae_lambda: float = 0.95
    """PPO: GAE lambda."""
    vf_coef: float = 0.5
    """PPO: value loss weight."""
    vf_clip: float = 0.2
    """PPO: value clip range around the old values; 0 disables."""
    kl: str = "none"
    """KL to the initial policy: none, k1_reward (penalty in the reward) or k3_loss (term in the loss)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty."""
    entropy_coef: float | dict[str, Any] = 0.0
    """Entropy bonus weight: a number or a schedule (seed: linear 0.01 -> 0.001)."""
    reward_weights: dict[str, float | dict[str, Any]] = field(default_factory=dict)
    """Extra weight (number or schedule) per reward term, applied on top of the env's weights; others 1."""
    max_staleness: int = 2
    """Samples whose policy version is more than this behind the learner are dropped."""
    is_truncation: float = 2.0
    """C of the truncated importance weights min(pi_learner / pi_sampler, C); 0 turns the correction off."""

    # -- supervised warm start -----------------------------------------------------------------------
    sft_warmup_steps: int = 0
    """Steps of SFT on ``sft_data`` before RL starts (BC -> SFT -> RL); they count in ``steps``."""
    sft_data: str = "expert"
    """expert (the env's scripted_rule), policy (own samples: rejection sampling) or a trajectories JSONL."""
    sft_min_reward: float = 1.0
    """SFT keeps trajectories whose reward is >= this."""
    sft_keep: str = "all"
    """all (every trajectory >= sft_min_reward) or best (per group, the best one above its group's mean: RFT for a
    graded reward; ``algos.sft.select``)."""
    sft_lr: float | dict[str, Any] = 1e-4
    """Learning rate of the SFT warm-up steps (a number or a schedule)."""

    # -- evaluation ----------------------------------------------------------------------------------
    eval_every: int = 0
    """Steps between greedy evaluations on ``eval_split`` (0 = none); logged as eval/*."""
    eval_split: str = "test"
    """Task split of the evaluations: train, val, test or all."""
    eval_tasks: int = 16
    """Tasks per evaluation (one greedy episode each)."""

    def __post_init__(self) -> None:
        def need(ok: bool, what: str, **field: Any) -> None:
            """``field`` is the one field the error names, with its value: ``need(ok, "must be ...", kl=self.kl)``."""
            if not ok:
                ((name, value),) = field.items()
                raise ConfigError(f"TrainConfig.{name} {what}, got {value!r}")

        require("TrainConfig", "must be an integer >= 1", integer_at_least(1), error=ConfigError,
                steps=self.steps, tasks_per_step=self.tasks_per_step, group_size=self.group_size,
                max_turns=self.max_turns, max_context_tokens=self.max_context_tokens,
                max_new_tokens=self.max_new_tokens, concurrency=self.concurrency,
                epochs_per_batch=self.epochs_per_batch, minibatches=self.minibatches,
                micro_batch_tokens=self.micro_batch_tokens, lora_rank=self.lora_rank,
                keep_checkpoints=self.keep_checkpoints, eval_tasks=self.eval_tasks, ray_workers=self.ray_workers,
                nproc=self.nproc)  # fmt: skip
        require("TrainConfig", "must be an integer >= 0", integer_at_least(0), error=ConfigError,
                checkpoint_every=self.checkpoint_every, sft_warmup_steps=self.sft_warmup_steps,
                eval_every=self.eval_every, max_staleness=self.max_staleness,
                dynamic_sampling_max_rounds=self.dynamic_sampling_max_rounds)  # fmt: skip
        require("TrainConfig", "must be >= 0", finite_at_least(0), error=ConfigError,
                weight_decay=self.weight_decay, max_grad_norm=self.max_grad_norm, clip_eps_low=self.clip_eps_low,
                clip_eps_high=self.clip_eps_high, cispo_eps_low=self.cispo_eps_low,
                cispo_eps_high=self.cispo_eps_high, kimi_tau=self.kimi_tau, vf_coef=self.vf_coef,
                vf_clip=self.vf_clip, kl_coef=self.kl_coef, is_truncation=self.is_truncation,
                temperature=self.temperature, lora_alpha=self.lora_alpha,
                ray_num_cpus_per_worker=self.ray_num_cpus_per_worker,
                ray_num_gpus_per_worker=self.ray_num_gpus_per_worker)  # fmt: skip
        need(self.algo in ALGORITHMS, f"must be one of {', '.join(ALGORITHMS)}", algo=self.algo)  # the table, read now
        need(self.split in SPLITS, f"must be one of {', '.join(SPLITS)}", split=self.split)
        need(self.eval_split in SPLITS, f"must be one of {', '.join(SPLITS)}", eval_split=self.eval_split)
        need(self.kl in KL_MODES, f"must be one of {', '.join(KL_MODES)}", kl=self.kl)
        need(self.finetune in FINETUNE_MODES, f"must be one of {', '.join(FINETUNE_MODES)}", finetune=self.finetune)
        need(self.dtype in DTYPES, f"must be one of {', '.join(DTYPES)}", dtype=self.dtype)
        need(self.rollout_policy in ROLLOUT_POLICIES, f"must be one of {', '.join(ROLLOUT_POLICIES)}",
             rollout_policy=self.rollout_policy)  # fmt: skip
        need(not self.async_rollout or self.rollout_policy != "inprocess" or self.ray,
             "needs rollout_policy copy, server or vllm, or ray (rollouts must not sample weights mid-update)",
             async_rollout=self.async_rollout)  # fmt: skip
        need(not (self.ray and self.rollout_policy == "copy"),
             "must not be 'copy' with ray=true: the Ray actors already sample from their own copies",
             rollout_policy=self.rollout_policy)  # fmt: skip
        server = self.rollout_policy == "server"
        need(not server or self.rollout_url.startswith(("http://", "https://")),
             "must be the server's http(s) base URL with rollout_policy=server",
             rollout_url=self.rollout_url)  # fmt: skip
        need(not server or bool(self.rollout_model), "must name the served base model (server)",
             rollout_model=self.rollout_model)  # fmt: skip
        need(not server or self.finetune == "lora",
             "must not be 'server' with finetune='full': only LoRA adapters can be loaded into a running server "
             "(/v1/load_lora_adapter), full weights would need a restart; use rollout_policy='copy'",
             rollout_policy=self.rollout_policy)  # fmt: skip
        require("TrainConfig", "must be an integer >= 0", integer_at_least(0), error=ConfigError,
                rollout_restarts=self.rollout_restarts)  # fmt: skip
        if self.rollout_policy == "vllm":
            self._check_vllm(need)
        need(not self.vllm or self.rollout_policy == "vllm", "is the vLLM server's table: set rollout_policy='vllm'",
             vllm=self.vllm)  # fmt: skip
        need(self.learner_backend in LEARNER_BACKENDS,
             f"must be one of {', '.join(LEARNER_BACKENDS)}", learner_backend=self.learner_backend)  # fmt: skip
        need(self.learner_precision in LEARNER_PRECISIONS,
             f"must be one of {', '.join(LEARNER_PRECISIONS)}", learner_precision=self.learner_precision)  # fmt: skip
        need(self.rollout_dtype in ROLLOUT_DTYPES, f"must be one of {', '.join(ROLLOUT_DTYPES)}",
             rollout_dtype=self.rollout_dtype)  # fmt: skip
        need(self.rollout_dtype == "same" or self.rollout_policy == "copy",
             "must be 'same' unless rollout_policy='copy' (the in-process rollout samples the learner's own weights; "
             "a server or Ray actors load their own)", rollout_dtype=self.rollout_dtype)  # fmt: skip
        need(self.learner_backend != "fsdp2" or self.nproc == 1 or self.rollout_policy == "copy",
             "'fsdp2' with nproc > 1 needs rollout_policy='copy': a sharded model cannot decode on one rank alone, "
             "each rank samples from its own full copy", learner_backend=self.learner_backend)  # fmt: skip
        need(self.dist_backend in DIST_BACKENDS, f"must be one of {', '.join(DIST_BACKENDS)}",
             dist_backend=self.dist_backend)  # fmt: skip
        need(self.nproc <= self.tasks_per_step, f"must be <= tasks_per_step ({self.tasks_per_step})", nproc=self.nproc)
        need(self.nproc == 1 or self.device in ("auto", "cpu", "cuda"),
             "must be auto, cpu or cuda when nproc > 1 (each rank takes cuda:LOCAL_RANK)",
             device=self.device)  # fmt: skip
        need(not (self.dist_backend == "nccl" and self.device == "cpu"), "nccl needs CUDA devices",
             dist_backend=self.dist_backend)  # fmt: skip
        need(self.nproc == 1 or not self.ray, "must be 1 with ray=true (Ray rollouts feed one learner)",
             nproc=self.nproc)  # fmt: skip
        need(self.nproc == 1 or self.rollout_policy != "server",
             "must be 1 with rollout_policy='server' (every rank would push the same adapter)",
             nproc=self.nproc)  # fmt: skip
        need(self.ray_address in ("", "auto") or self.ray_address.startswith(("ray://", "http://")) or ":" in
             self.ray_address, 'must be "", "auto", "ray://host:port" or "host:port"', ray_address=self.ray_address)
        need(0 < self.top_p <= 1, "must be in (0, 1]", top_p=self.top_p)
        need(0 <= self.lora_dropout < 1, "must be in [0, 1)", lora_dropout=self.lora_dropout)
        need(0 <= self.gamma <= 1, "must be in [0, 1]", gamma=self.gamma)
        need(0 <= self.gae_lambda <= 1, "must be in [0, 1]", gae_lambda=self.gae_lambda)
        need(self.clip_eps_low < 1, "must be < 1", clip_eps_low=self.clip_eps_low)
        need(self.kimi_alpha < self.kimi_beta, f"must be below kimi_beta ({self.kimi_beta})",
             kimi_alpha=self.kimi_alpha)  # fmt: skip
        need(self.sft_keep in ("all", "best"), "must be one of all, best", sft_keep=self.sft_keep)
        need(self.sft_warmup_steps <= self.steps, f"must be <= steps ({self.steps})",
             sft_warmup_steps=self.sft_warmup_steps)  # fmt: skip
        need(bool(self.lora_targets), "must name at least one module", lora_targets=self.lora_targets)
        need(self.kl == "none" or self.kl_coef > 0, f"must be > 0 when kl={self.kl!r}", kl_coef=self.kl_coef)
        try:
            compaction = context.from_value(self.summary, "TrainConfig.summary")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        need(compaction is None or compaction.trigger_tokens < self.max_context_tokens,
             f"trigger_tokens must be below max_context_tokens ({self.max_context_tokens})",
             summary=self.summary)  # fmt: skip
        chosen = ALGORITHMS[self.algo]
        rl = not chosen.imitation and self.sft_warmup_steps < self.steps
        need(not rl or self.group_size >= chosen.min_group_size,
             f"must be >= {chosen.min_group_size} for {self.algo}", group_size=self.group_size)  # fmt: skip
        group_relative = [name for name, a in ALGORITHMS.items() if a.min_group_size >= 2]
        need(not self.dynamic_sampling or chosen.min_group_size >= 2,
             f"must be false for algo={self.algo!r}: it keeps groups whose rewards differ, which only the "
             f"group-relative algorithms ({', '.join(group_relative)}) need",
             dynamic_sampling=self.dynamic_sampling)  # fmt: skip
        need(not self.dynamic_sampling or self.drop_zero_variance,
             "must be true with dynamic_sampling=true (dynamic sampling drops the zero-variance groups)",
             drop_zero_variance=self.drop_zero_variance)  # fmt: skip
        need(not self.dynamic_sampling or self.nproc == 1,
             "must be 1 with dynamic_sampling=true (the extra rounds are played by one process)",
             nproc=self.nproc)  # fmt: skip
        try:
            for name, value in {"lr": self.lr, "sft_lr": self.sft_lr, "entropy_coef": self.entropy_coef}.items():
                make_schedule(value, field=f"TrainConfig.{name}")
            for term, spec in self.reward_weights.items():
                make_schedule(spec, field=f"TrainConfig.reward_weights.{term}")
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _check_vllm(self, need: Any) -> None:
        """rollout_policy='vllm': LoRA on one learner, logprobs the learner can match, a valid server table."""
        from taskrl.policies.vllm_server import vllm_server_config

        need(self.finetune == "lora",
             "must not be 'vllm' with finetune='full': updates reach vLLM as hot-loaded LoRA adapters; "
             "use rollout_policy='copy' for full fine-tuning", rollout_policy=self.rollout_policy)  # fmt: skip
        need(self.nproc == 1, "must be 1 with rollout_policy='vllm' (every rank would load the same adapter)",
             nproc=self.nproc)  # fmt: skip
        need(self.top_p == 1.0,
             "must be 1 with rollout_policy='vllm': vLLM renormalises logprobs after top-p truncation, which the "
             "learner cannot match", top_p=self.top_p)  # fmt: skip
        need(not self.rollout_url or self.rollout_url.startswith(("http://", "https://")),
             "must be a vLLM's http(s) base URL, or \"\" to start a local one", rollout_url=self.rollout_url)
        need(not self.rollout_url or bool(self.rollout_model),
             "must name the served base model when rollout_url points at a vLLM", rollout_model=self.rollout_model)
        try:
            vllm_server_config(self.vllm, model="(model)", lora_rank=self.lora_rank,
                               max_staleness=self.max_staleness)  # fmt: skip
        except (TypeError, ValueError) as e:
            raise ConfigError(f"TrainConfig.vllm: {e}") from None

    @property
    def phases(self) -> tuple[int, int]:
        """(SFT steps, RL steps) of the run."""
        if ALGORITHMS[self.algo].imitation:
            return self.steps, 0
        return self.sft_warmup_steps, self.steps - self.sft_warmup_steps

    def plan(self) -> str:
        """One line saying what this run will do (printed before anything loads)."""
        sft, rl = self.phases
        phases = " + ".join(p for p in (f"{sft} SFT ({self.sft_data})" if sft else "",
                                        f"{rl} {self.algo}" if rl else "") if p)  # fmt: skip
        return (f"train env {self.env!r} on model {self.model!r} ({self.finetune}): {self.steps} steps ({phases}), "
                f"{self.tasks_per_step} tasks x {self.group_size} samples per step, split {self.split!r}, seed "
                f"{self.seed} -> {self.run_dir}")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def field_docs() -> dict[str, str]:
    """Each TrainConfig field's docstring (the string under it in the source), for ``taskrl train --help``."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(TrainConfig))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, following in zip(body, body[1:], strict=False):
        named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if named and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = " ".join(str(following.value.value).split())  # type: ignore[union-attr]
    return docs


def fields_help() -> str:
    """The fields a config file or ``--set`` may set, with defaults and their first sentence."""
    defaults = TrainConfig().to_dict()
    lines = [
        f"{name} = {defaults[name]!r}: {doc.split('; ')[0].split('. ')[0].rstrip('.')}"
        for name, doc in field_docs().items()
    ]
    return "Config fields (TOML keys, or --set field=value):\n\n" + "\n\n".join(lines)


def _parse_value(text: str) -> Any:
    """A TOML value (number, bool, string, array, inline table); anything unparsable is a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["lr=1e-4", "env=shop"]`` -> ``{"lr": 1e-4, "env": "shop"}``."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not field=value (e.g. --set lr=1e-4)")
        out[key.strip()] = _parse_value(value.strip())
    return out


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Build a TrainConfig; unknown keys and wrong types fail naming the key."""
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        named = ", ".join(f"{key}{did_you_mean(key, known)}" for key in unknown)
        raise ConfigError(f"unknown TrainConfig field(s): {named}; `taskrl train --help` lists them all")
    defaults = TrainConfig().to_dict()
    for key, value in data.items():
        default = defaults[key]
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if key in _SCHEDULE_FIELDS:
            ok, expected = is_number or isinstance(value, dict), "a number or a schedule table"
        elif isinstance(default, bool):
            ok, expected = isinstance(value, bool), "a boolean"
        elif isinstance(default, int):
            ok, expected = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif isinstance(default, float):
            ok, expected = is_number, "a number"
            data[key] = float(value) if ok else value
        else:
            ok, expected = isinstance(value, type(default)), f"a {type(default).__name__}"
        if not ok:
            raise ConfigError(f"TrainConfig.{key} must be {expected}, got {value!r}")
    return TrainConfig(**data)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """TOML file (optional) plus ``field=value`` overrides -> a validated TrainConfig."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} not found; see recipes/ for examples")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
    data.update(parse_overrides(overrides or []))
    return config_from_dict(data)
