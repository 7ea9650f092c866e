"""TrainConfig: the config of ``taskrl train``, composed of sections, validated at start, loaded from TOML plus
overrides.

    config = load_config("recipes/grpo_smollm2_lora.toml", ["lr=1e-4", "rollout.temperature=0.7"])

Sections are TOML tables, or dotted keys: ``[rollout]`` (``RolloutSettings``: what a step plays), ``[placement]``
(``PlacementConfig``: where it runs: processes, Ray, the rollout engine), ``[lora]`` (``LoraConfig``) and ``[algo]``
(``name`` picks the algorithm; its own dataclass, declared in ``taskrl/algos/<name>.py``, holds its fields). Each
section validates itself and its errors name the dotted field. Overrides are ``key=value`` with a TOML value
(``lr=1e-4``, ``rollout.temperature=0.7``, ``algo.name=ppo``, ``lora.targets=["q_proj"]``,
``lr={kind="cosine", start=3e-5, end=1e-6, steps=100}``); a bare word is taken as a string. Unknown keys and bad
values fail before anything runs, naming the field; a key of the old flat config (``temperature``) fails naming
its new place (``MOVED``: "moved to rollout.temperature").
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrl.algos import ALGORITHMS
from taskrl.algos.algorithm import AlgoConfig
from taskrl.algos.grpo import GroupConfig, GRPOConfig
from taskrl.algos.schedules import make_schedule
from taskrl.algos.sft import KEEP_MODES
from taskrl.training.sections import (
    DTYPES,
    FINETUNE_MODES,
    KL_MODES,
    LEARNER_PRECISIONS,
    SPLITS,
    ConfigError,
    LoraConfig,
    PlacementConfig,
    RolloutSettings,
    need,
    one_of,
)
from taskrl.validate import did_you_mean, finite_at_least, integer_at_least, require

__all__ = ["MOVED", "ConfigError", "LoraConfig", "PlacementConfig", "RolloutSettings", "TrainConfig",
           "config_from_dict", "load_config", "migrate_flat", "parse_overrides"]  # fmt: skip

_SCHEDULE_FIELDS = ("lr", "sft_lr", "entropy_coef")

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
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (less memory, about
    one more forward of compute); exact, and compatible with the shared-prompt KV path."""

    # -- model ---------------------------------------------------------------------------------------
    model: str = "smollm2"
    """'smollm2' (bundled SmolLM2-135M-Instruct), a local save_pretrained directory, or a trained run directory
    or LoRA adapter (merged onto its recorded base): training continues from a trained policy."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16, float16 (the learner's master weights and optimizer math) or auto
    (bfloat16 only where the hardware accelerates it, as ``learner_precision``; else float32: on a CPU without
    amx_bf16/avx512_bf16, bfloat16 weights are emulated and a training step ran 22x slower). Printed at start."""
    learner_precision: str = "float32"
    """Compute dtype of the learner's forward/backward: float32, bfloat16 (torch.autocast over fp32 master weights;
    logprobs and losses stay float32) or auto (bfloat16 only where the hardware accelerates it: CUDA with bf16
    support, a CPU with amx_bf16/avx512_bf16; else float32). The choice is printed at start."""
    finetune: str = "lora"
    """full (every parameter not matched by ``freeze``) or lora (peft adapters; the base stays frozen)."""
    freeze: list[str] = field(default_factory=list)
    """Regular expressions of parameter names kept frozen in full fine-tuning (e.g. 'embed_tokens')."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """``[lora]``: rank, alpha, dropout and target modules of the adapters (finetune = "lora")."""

    # -- env, rollout, placement ---------------------------------------------------------------------
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
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    """``[rollout]``: tasks and samples per step, episode budgets, sampling, async rollouts and staleness."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """``[placement]``: learner processes and backends, Ray rollout actors, the rollout engine (inprocess, copy,
    server, vllm) and its URL."""

    # -- algorithm and learner -----------------------------------------------------------------------
    algo: AlgoConfig = field(default_factory=GRPOConfig)
    """``[algo]``: ``name`` (grpo, ppo, cispo, kimi, sft: ``taskrl.algos.ALGORITHMS``) and that algorithm's own
    fields (its dataclass in ``taskrl/algos/<name>.py``, e.g. ``algo.clip_eps_high`` of grpo)."""
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
    dynamic_sampling: bool = False
    """Group-relative RL steps: drop groups whose rewards are all equal and play more tasks until tasks_per_step
    groups with signal are in hand (DAPO's dynamic sampling; ``taskrl.training.filters``), logged as
    charts/dynamic_* (rounds, groups drawn, dropped, trimmed)."""
    dynamic_sampling_max_rounds: int = 3
    """dynamic_sampling: extra collection rounds a step may play at most (0 = only drop the flat groups)."""
    overlong_filter: bool = False
    """RL steps: episodes cut off by the token budget (max_new_tokens or max_context_tokens), or with any turn cut
    short by max_new_tokens (tools/capped_turns), get no loss (DAPO's overlong filtering); their rewards still count
    in their group's mean (so where they are the successes, the episodes that end in budget are pushed down: give
    max_new_tokens room instead). SFT steps clone none of them (RFT's capped successes, or a demonstration the cap
    cut). Counted in charts/overlong_filtered."""
    kl: str = "none"
    """KL to the initial policy: none, k1_reward (penalty in the reward) or k3_loss (term in the loss)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty."""
    entropy_coef: float | dict[str, Any] = 0.0
    """Entropy bonus weight: a number or a schedule (seed: linear 0.01 -> 0.001)."""
    reward_weights: dict[str, float | dict[str, Any]] = field(default_factory=dict)
    """Extra weight (number or schedule) per reward term, applied on top of the env's weights; others 1."""
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
        """Top-level fields, then what crosses sections (each section checked itself when it was built)."""
        require("TrainConfig", "must be an integer >= 1", integer_at_least(1), error=ConfigError,
                steps=self.steps, epochs_per_batch=self.epochs_per_batch, minibatches=self.minibatches,
                micro_batch_tokens=self.micro_batch_tokens, keep_checkpoints=self.keep_checkpoints,
                eval_tasks=self.eval_tasks)  # fmt: skip
        require("TrainConfig", "must be an integer >= 0", integer_at_least(0), error=ConfigError,
                checkpoint_every=self.checkpoint_every, sft_warmup_steps=self.sft_warmup_steps,
                eval_every=self.eval_every, dynamic_sampling_max_rounds=self.dynamic_sampling_max_rounds)  # fmt: skip
        require("TrainConfig", "must be >= 0", finite_at_least(0), error=ConfigError,
                weight_decay=self.weight_decay, max_grad_norm=self.max_grad_norm, kl_coef=self.kl_coef,
                is_truncation=self.is_truncation)  # fmt: skip
        for name, section, kind in (("rollout", self.rollout, RolloutSettings), ("lora", self.lora, LoraConfig),
                                    ("placement", self.placement, PlacementConfig), ("algo", self.algo, AlgoConfig)):
            need(isinstance(section, kind), f"must be a {kind.__name__} (a TOML table [{name}])", **{name: section})
        need(self.algo.name in ALGORITHMS, f"must be one of {', '.join(ALGORITHMS)}",
              algo__name=self.algo.name)  # the table, read now
        chosen = ALGORITHMS[self.algo.name]
        need(isinstance(self.algo, chosen.config),
              f"is {type(self.algo).__name__}, but algo.name={self.algo.name!r} takes {chosen.config.__name__}",
              algo=self.algo)  # fmt: skip
        one_of(self.split, SPLITS, "split")
        one_of(self.eval_split, SPLITS, "eval_split")
        one_of(self.kl, KL_MODES, "kl")
        one_of(self.finetune, FINETUNE_MODES, "finetune")
        one_of(self.dtype, DTYPES, "dtype")
        one_of(self.learner_precision, LEARNER_PRECISIONS, "learner_precision")
        one_of(self.sft_keep, KEEP_MODES, "sft_keep")
        rollout, place = self.rollout, self.placement
        need(not rollout.async_rollout or place.rollout_policy != "inprocess" or place.ray,
              "needs placement.rollout_policy copy, server or vllm, or placement.ray (rollouts must not sample "
              "weights mid-update)", rollout__async_rollout=rollout.async_rollout)  # fmt: skip
        need(place.rollout_policy != "server" or self.finetune == "lora",
              "must not be 'server' with finetune='full': an OpenAI-compatible server takes LoRA adapters only; "
              "use rollout_policy='vllm' (weights reloaded in place) or 'copy'",
              placement__rollout_policy=place.rollout_policy)  # fmt: skip
        if place.rollout_policy == "vllm":
            self._check_vllm()
        need(place.nproc <= rollout.tasks_per_step, f"must be <= rollout.tasks_per_step ({rollout.tasks_per_step})",
              placement__nproc=place.nproc)  # fmt: skip
        need(place.nproc == 1 or self.device in ("auto", "cpu", "cuda"),
              "must be auto, cpu or cuda when placement.nproc > 1 (each rank takes cuda:LOCAL_RANK)",
              device=self.device)  # fmt: skip
        need(not (place.dist_backend == "nccl" and self.device == "cpu"), "nccl needs CUDA devices",
              placement__dist_backend=place.dist_backend)  # fmt: skip
        need(self.sft_warmup_steps <= self.steps, f"must be <= steps ({self.steps})",
              sft_warmup_steps=self.sft_warmup_steps)  # fmt: skip
        need(self.kl == "none" or self.kl_coef > 0, f"must be > 0 when kl={self.kl!r}", kl_coef=self.kl_coef)
        rl = not chosen.imitation and self.sft_warmup_steps < self.steps
        need(not rl or rollout.group_size >= chosen.min_group_size,
              f"must be >= {chosen.min_group_size} for {self.algo.name}", rollout__group_size=rollout.group_size)
        group_relative = [name for name, a in ALGORITHMS.items() if a.min_group_size >= 2]
        need(not self.dynamic_sampling or chosen.min_group_size >= 2,
              f"must be false for algo.name={self.algo.name!r}: it keeps groups whose rewards differ, which only "
              f"the group-relative algorithms ({', '.join(group_relative)}) need",
              dynamic_sampling=self.dynamic_sampling)  # fmt: skip
        need(not self.dynamic_sampling or (isinstance(self.algo, GroupConfig) and self.algo.drop_zero_variance),
              "must be true with dynamic_sampling=true (dynamic sampling drops the zero-variance groups)",
              algo__drop_zero_variance=getattr(self.algo, "drop_zero_variance", None))  # fmt: skip
        need(not self.dynamic_sampling or place.nproc == 1,
              "must be 1 with dynamic_sampling=true (the extra rounds are played by one process)",
              placement__nproc=place.nproc)  # fmt: skip
        try:
            for name, value in {"lr": self.lr, "sft_lr": self.sft_lr, "entropy_coef": self.entropy_coef}.items():
                make_schedule(value, field=f"TrainConfig.{name}")
            for term, spec in self.reward_weights.items():
                make_schedule(spec, field=f"TrainConfig.reward_weights.{term}")
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _check_vllm(self) -> None:
        """rollout_policy='vllm': logprobs the learner can match, a valid server table."""
        from taskrl.policies.vllm_server import vllm_server_config

        need(self.rollout.top_p == 1.0,
              "must be 1 with placement.rollout_policy='vllm': vLLM renormalises logprobs after top-p truncation, "
              "which the learner cannot match", rollout__top_p=self.rollout.top_p)  # fmt: skip
        try:
            vllm_server_config(self.placement.vllm, model="(model)", lora_rank=self.lora.rank,
                               max_staleness=self.rollout.max_staleness)  # fmt: skip
        except (TypeError, ValueError) as e:
            raise ConfigError(f"placement.vllm: {e}") from None

    @property
    def phases(self) -> tuple[int, int]:
        """(SFT steps, RL steps) of the run."""
        if ALGORITHMS[self.algo.name].imitation:
            return self.steps, 0
        return self.sft_warmup_steps, self.steps - self.sft_warmup_steps

    def plan(self) -> str:
        """One line saying what this run will do (printed before anything loads)."""
        sft, rl = self.phases
        phases = " + ".join(p for p in (f"{sft} SFT ({self.sft_data})" if sft else "",
                                        f"{rl} {self.algo.name}" if rl else "") if p)  # fmt: skip
        return (f"train env {self.env!r} on model {self.model!r} ({self.finetune}): {self.steps} steps ({phases}), "
                f"{self.rollout.tasks_per_step} tasks x {self.rollout.group_size} samples per step, split "
                f"{self.split!r}, seed {self.seed} -> {self.run_dir}")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The nested dict ``config_from_dict`` reads back (sections as tables, ``algo.name`` included)."""
        return dataclasses.asdict(self)

    def override(self, changes: dict[str, Any]) -> TrainConfig:
        """A validated copy with ``changes``, keyed as in a config file or ``--set`` (``{"steps": 5,
        "rollout.temperature": 0.7}``); a new ``algo.name`` starts from that algorithm's defaults."""
        current, changes = dotted(self.to_dict()), dotted(changes)
        if changes.get("algo.name", self.algo.name) != self.algo.name:
            current = {k: v for k, v in current.items() if not k.startswith("algo.")}
        return config_from_dict({**current, **changes})


SECTIONS: dict[str, type] = {"rollout": RolloutSettings, "placement": PlacementConfig, "lora": LoraConfig}
"""The sections with one dataclass; ``algo``'s dataclass depends on ``algo.name``."""

_RENAMED = {
    "algo": "algo.name", "lora_rank": "lora.rank", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
    "lora_targets": "lora.targets", "cispo_eps_low": "algo.eps_low", "cispo_eps_high": "algo.eps_high",
    "kimi_alpha": "algo.alpha", "kimi_beta": "algo.beta", "kimi_tau": "algo.tau",
}  # fmt: skip
MOVED: dict[str, str] = {
    **{f.name: f"{section}.{f.name}" for section in ("rollout", "placement")
       for f in dataclasses.fields(SECTIONS[section])},
    **{name: f"algo.{name}" for name in ("normalize_std", "drop_zero_variance", "clip_eps_low", "clip_eps_high",
                                         "gamma", "gae_lambda", "vf_coef", "vf_clip")},
    **_RENAMED,
}  # fmt: skip
"""Every key of the old flat TrainConfig that moved, and its dotted place now (``temperature`` ->
``rollout.temperature``): ``config_from_dict`` rejects the old key naming this place, and
``migrate_flat`` converts an old run directory's saved config once."""


def _field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string under it in the source) of one config dataclass."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, following in zip(body, body[1:], strict=False):
        named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if named and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = " ".join(str(following.value.value).split())  # type: ignore[union-attr]
    return docs


def field_docs() -> dict[str, str]:
    """Every config key (dotted for sections; ``algo.<field>`` of each algorithm) and its docstring, for
    ``taskrl train --help``."""
    docs: dict[str, str] = {}
    for name, doc in _field_docs(TrainConfig).items():
        if name in SECTIONS:
            docs.update({f"{name}.{key}": text for key, text in _field_docs(SECTIONS[name]).items()})
        elif name == "algo":
            docs["algo.name"] = _field_docs(AlgoConfig)["name"]
            for entry in ALGORITHMS.values():
                for cls in reversed(entry.config.__mro__[:-1]):  # inherited fields documented on their class
                    for key, text in _field_docs(cls).items():
                        if key != "name":
                            docs.setdefault(f"algo.{key}", f"({entry.name}) {text}")
        else:
            docs[name] = doc
    return docs


def _defaults() -> dict[str, Any]:
    """Dotted key -> default, over the sections and every algorithm's fields."""
    out = dotted(TrainConfig().to_dict())
    for entry in ALGORITHMS.values():
        out.update({f"algo.{k}": v for k, v in dataclasses.asdict(entry.config()).items() if k != "name"})
    return out


def fields_help() -> str:
    """The keys a config file or ``--set`` may set, with defaults and their first sentence."""
    defaults = _defaults()
    lines = [
        f"{name} = {defaults.get(name, '(algorithm default)')!r}: {doc.split('; ')[0].split('. ')[0].rstrip('.')}"
        for name, doc in field_docs().items()
    ]
    return ("Config keys (top-level TOML keys; section keys dotted, rollout.temperature = 1.0, or in a rollout/"
            "placement/lora/algo table; --set key=value):\n\n"
            + "\n\n".join(lines))  # fmt: skip


def _parse_value(text: str) -> Any:
    """A TOML value (number, bool, string, array, inline table); anything unparsable is a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["lr=1e-4", "rollout.temperature=0.7"]`` -> ``{"lr": 1e-4, "rollout.temperature": 0.7}`` (dotted keys
    kept; ``config_from_dict`` nests them)."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value (e.g. --set lr=1e-4)")
        out[key.strip()] = _parse_value(value.strip())
    return out


def dotted(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested section tables -> dotted keys, one level deep (a section's dict-valued fields stay dicts)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not prefix and key in (*SECTIONS, "algo") and isinstance(value, dict):
            out.update(dotted(value, f"{key}."))
        else:
            out[prefix + key] = value
    return out


def _merge(data: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``updates`` laid over it, both as dotted keys (an override changes one field of a section)."""
    return {**dotted(data), **dotted(updates)}


def _check_type(key: str, value: Any, default: Any) -> Any:
    """``value`` for the field ``key`` whose default is ``default`` (ints become floats where a float is due)."""
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if key.removeprefix("TrainConfig.") in _SCHEDULE_FIELDS:
        ok, expected = is_number or isinstance(value, dict), "a number or a schedule table"
    elif isinstance(default, bool):
        ok, expected = isinstance(value, bool), "a boolean"
    elif isinstance(default, int):
        ok, expected = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, expected = is_number, "a number"
        value = float(value) if ok else value
    else:
        ok, expected = isinstance(value, type(default)), f"a {type(default).__name__}"
    if not ok:
        raise ConfigError(f"{key} must be {expected}, got {value!r}")
    return value


def _build(cls: type, prefix: str, values: dict[str, Any]) -> Any:
    """``cls(**values)`` after checking each value's type against ``cls``'s defaults; errors name the dotted key."""
    defaults = dataclasses.asdict(cls())
    checked = {k: _check_type(f"{prefix}{k}", v, defaults[k]) for k, v in values.items()}
    try:
        return cls(**checked)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Build a TrainConfig from nested tables and/or dotted keys (``{"rollout": {"temperature": 0.7}}`` or
    ``{"rollout.temperature": 0.7}``); unknown keys, old flat keys (naming their new place) and wrong types fail
    naming the key."""
    flat = dotted(data)
    moved = sorted(k for k in flat if k in MOVED and not (k == "algo" and isinstance(flat[k], AlgoConfig)))
    if moved:
        named = ", ".join(f"{key} moved to {MOVED[key]}" for key in moved)
        raise ConfigError(f"old flat config key(s): {named}; write each dotted (e.g. {MOVED[moved[0]]} = ...) or "
                          "under its [section] table (`taskrl train --help` lists every key)")  # fmt: skip
    top = {f.name for f in dataclasses.fields(TrainConfig)} - {*SECTIONS, "algo"}
    sections: dict[str, dict[str, Any]] = {name: {} for name in (*SECTIONS, "algo")}
    values: dict[str, Any] = {}
    unknown = []
    for key, value in flat.items():
        section, dot, leaf = key.partition(".")
        if dot and section in sections:
            sections[section][leaf] = value
        elif key in top:
            values[key] = value
        else:
            unknown.append(key)
    for name, cls in SECTIONS.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown += [f"{name}.{k}{did_you_mean(k, fields)}" for k in sections[name] if k not in fields]
    if unknown:
        known = [*top, *(f"{s}.{f.name}" for s, c in SECTIONS.items() for f in dataclasses.fields(c))]
        named = ", ".join(k if "(" in k else f"{k}{did_you_mean(k, known)}" for k in sorted(unknown))
        raise ConfigError(f"unknown config key(s): {named}; `taskrl train --help` lists them all")
    defaults = TrainConfig().to_dict()
    values = {k: _check_type(f"TrainConfig.{k}", v, defaults[k]) for k, v in values.items()}
    for name, cls in SECTIONS.items():
        values[name] = _build(cls, f"{name}.", sections[name])
    values["algo"] = _algo(sections["algo"])
    return TrainConfig(**values)


def _algo(table: dict[str, Any]) -> AlgoConfig:
    """The ``[algo]`` table -> the named algorithm's own config; a field of another algorithm fails naming it."""
    table = dict(table)
    name = table.pop("name", "grpo")
    need(isinstance(name, str) and name in ALGORITHMS, f"must be one of {', '.join(ALGORITHMS)}", algo__name=name)
    cls = ALGORITHMS[name].config
    fields = {f.name for f in dataclasses.fields(cls)} - {"name"}
    foreign = sorted(set(table) - fields)
    if foreign:
        owners = {key: [a.name for a in ALGORITHMS.values() if key in {f.name for f in dataclasses.fields(a.config)}]
                  for key in foreign}  # fmt: skip
        named = ", ".join(f"algo.{k}" + (f" (a field of {', '.join(o)})" if o else did_you_mean(k, fields))
                          for k, o in owners.items())  # fmt: skip
        raise ConfigError(f"{named}: not a field of algo.name={name!r} ({cls.__name__}: "
                          f"{', '.join(sorted(fields)) or 'no fields'})")  # fmt: skip
    config = _build(cls, "algo.", table)
    config.name = name  # an entry may reuse another's dataclass (its name is the entry's)
    return config


def migrate_flat(saved: dict[str, Any]) -> dict[str, Any]:
    """An old flat saved config (a run directory's config.json from before sections) -> the nested form, each
    moved key put at its ``MOVED`` place; a config already nested is returned as it is."""
    if not any(k in MOVED and not isinstance(v, dict) for k, v in saved.items()):
        return saved
    out: dict[str, Any] = {}
    for key, value in saved.items():
        section, _, leaf = MOVED.get(key, key).rpartition(".")
        (out.setdefault(section, {}) if section else out)[leaf] = value
    algo = out.setdefault("algo", {})
    fields = {f.name for f in dataclasses.fields(ALGORITHMS[algo.get("name", "grpo")].config)}
    out["algo"] = {k: v for k, v in algo.items() if k in fields}  # the flat config kept every algorithm's fields
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """TOML file (optional) plus ``key=value`` overrides -> a validated TrainConfig."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} not found; see recipes/ for examples")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
    return config_from_dict(_merge(data, parse_overrides(overrides or [])))
