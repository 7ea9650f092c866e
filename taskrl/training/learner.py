"""The learner: any list of trajectories -> advantages -> micro-batched, gradient-accumulated optimizer steps.

``Learner(model, config).update(trajectories, step=...)`` is callable on any trajectories (fresh, replayed,
from another process): it drops untrainable and too-stale samples, scores them when needed (old logprobs,
reference logprobs, values), computes advantages with the configured algorithm (looked up in
``taskrl.algos.ALGORITHMS``: its advantage function, token loss and value loss), and trains only on
loss_mask = 1 tokens, each weighted 1 / (sampled tokens in the optimizer step), with truncated importance
weights against the sampler's logprobs. Each call that changes the weights bumps ``version``; the trainer
syncs that version into the rollout policy.

Mixed precision (``learner_precision``) runs the forward/backward under autocast over the fp32 master weights;
``losses/mismatch_kl`` measures how far the sampler's logprobs are from the learner's. An optimizer step whose
loss or gradient is not finite is skipped (weights and AdamW state untouched), counted in
``charts/nonfinite_skipped`` and logged as a one-line alert. With ``learner_backend="fsdp2"`` on several ranks
the model is sharded (``taskrl.distributed.fsdp``); ``trainable_state`` then holds DTensors (this rank's shards)
and ``gathered_state`` yields the whole tensors one at a time.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from taskrl.algos import algorithm, sft
from taskrl.algos.algorithm import TrajectoryInput
from taskrl.algos.losses import approx_kl, kl_k1, kl_k3, truncated_is_weights
from taskrl.algos.schedules import make_schedule
from taskrl.distributed import fsdp
from taskrl.distributed.ddp import DataParallel
from taskrl.policies.precision import learner_autocast
from taskrl.seeding import derive_seed
from taskrl.training.batching import TokenSequence, collate, plan_micro_batches, plan_step, sequences_from
from taskrl.training.config import TrainConfig
from taskrl.training.filters import overlong
from taskrl.training.model import LearnerGraph, Reference, StepPrefix, decoder_layers, forward, make_value_head
from taskrl.types import Trajectory

SUMMED_OVER_RANKS = ("charts/offered_trajectories", "charts/stale_dropped", "charts/untrainable",
                     "charts/infra_failures", "charts/groups",
                     "charts/dropped_groups", "charts/trained_trajectories", "charts/trained_tokens",
                     "charts/forward_tokens", "charts/overlong_filtered")  # fmt: skip
"""Count metrics of a data-parallel update: each rank counts its own share, the update reports the total."""
NONFINITE_ALERT = "nonfinite_update"
"""Monitor name of the alert raised when an optimizer step is skipped for a non-finite loss or gradient."""

logger = logging.getLogger(__name__)


class _Scores:
    """Per-sequence tensors filled before the update (old logprobs, reference logprobs, values, advantages)."""

    def __init__(self) -> None:
        self.old: dict[int, torch.Tensor] = {}
        self.ref: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.last_value: dict[int, float] = {}
        self.advantages: dict[int, torch.Tensor] = {}
        self.returns: dict[int, torch.Tensor] = {}


class _Stats:
    """Token-weighted means of loss diagnostics over an update."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)

    def add(self, name: str, values: torch.Tensor) -> None:
        self.sums[name] += float(values.detach().float().sum())
        self.counts[name] += values.numel()

    def add_scalar(self, name: str, value: float) -> None:
        self.sums[name] += value
        self.counts[name] += 1

    def means(self) -> dict[str, float]:
        return {name: self.sums[name] / self.counts[name] for name in self.sums if self.counts[name]}

    def over_ranks(self, group: DataParallel) -> _Stats:
        """The stats of every rank's tokens (a per-step scalar such as grad_norm is equal on all ranks)."""
        out = _Stats()
        for sums, counts in group.all_gather((dict(self.sums), dict(self.counts))):
            for name, value in sums.items():
                out.sums[name] += value
                out.counts[name] += counts[name]
        return out


def usable_trajectories(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """What an update may learn from: trainable, with sampled tokens, and no infrastructure failure (a broken
    sandbox, engine or server is no sample of the policy: its group's advantages are those of the rest)."""
    return [t for t in trajectories if t.trainable and t.num_sampled_tokens > 0 and t.infra_failure is None]


class Learner:
    """Owns the trainable model, the optional value head and reference, the optimizer and the LR schedules."""

    def __init__(
        self, model: Any, config: TrainConfig, *, pad_id: int = 0, data_parallel: DataParallel | None = None
    ) -> None:
        """``data_parallel``: this process's learner group; each rank then updates on its own trajectories (whole
        groups) and the weights move as one process's would on all ranks' trajectories concatenated in rank order."""
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.group = data_parallel or DataParallel()
        self.device = next(model.parameters()).device
        self.version = 0
        self.autocast_dtype, self.precision_note = learner_autocast(config.learner_precision, self.device)
        self.algorithm = algorithm(config.algo.name)
        self.value_head = make_value_head(model) if self.algorithm.value_head else None
        self.reference = Reference(model) if config.kl != "none" else None  # a full-FT copy is taken before sharding
        self.graph = LearnerGraph(model)
        self.ref_graph = LearnerGraph(self.reference.copy) if self.reference and self.reference.copy else None
        self.sharded = config.placement.learner_backend == "fsdp2" and self.group.active
        # One prompt pass per optimizer step (model.StepPrefix): not sharded (every rank must make the same decoder
        # calls) and only on a plain per-layer KV cache.
        self.step_prefix = not self.sharded and StepPrefix.supported(model)
        if self.sharded:
            fsdp.shard(self.graph, decoder_layers(model), self.group)
            if self.ref_graph is not None:
                fsdp.shard(self.ref_graph, decoder_layers(self.ref_graph.model), self.group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if self.value_head is not None:
            self.params += list(self.value_head.parameters())
        # Sharded and replicated (value head) parameters do not mix in one foreach kernel.
        foreach = None if not self.sharded else False
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0, weight_decay=config.weight_decay, foreach=foreach)
        self.nonfinite_skipped = 0
        """Optimizer steps skipped so far because their loss or gradient was not finite."""
        self.lr = make_schedule(config.lr, field="TrainConfig.lr")
        self.sft_lr = make_schedule(config.sft_lr, field="TrainConfig.sft_lr")
        self.entropy_coef = make_schedule(config.entropy_coef, field="TrainConfig.entropy_coef")

    # -- public ------------------------------------------------------------------------------------
    def update(self, trajectories: Sequence[Trajectory], *, step: int, sft_mode: bool = False) -> dict[str, float]:
        """One learner step on ``trajectories``: ``config.algo.name``'s or, with ``sft_mode``, behaviour cloning.

        ``step`` drives the schedules (RL steps count from the end of the SFT warm-up) and the minibatch
        shuffle. Returns ``losses/*`` and ``charts/*`` metrics.
        """
        cfg = self.config
        sft_mode = sft_mode or self.algorithm.imitation
        metrics: dict[str, float] = {"charts/offered_trajectories": float(len(trajectories))}
        usable = usable_trajectories(trajectories)
        metrics["charts/infra_failures"] = float(sum(t.infra_failure is not None for t in trajectories))
        if sft_mode:
            batch = sft.select(usable, min_reward=cfg.sft_min_reward, keep=cfg.sft_keep)
            if cfg.overlong_filter:  # RFT: a success the cap ended is no demonstration of ending the turn
                kept = [t for t in batch if not overlong(t)]
                metrics["charts/overlong_filtered"] = float(len(batch) - len(kept))
                batch = kept
        else:
            batch = [t for t in usable if self._staleness(t) <= cfg.rollout.max_staleness]
            metrics["charts/stale_dropped"] = float(len(usable) - len(batch))
        metrics["charts/untrainable"] = float(len(trajectories) - len(usable))
        sequences = sequences_from(batch)
        scores = _Scores()
        if not sft_mode:
            self._score(sequences, scores)
            kept = self._advantages(batch, sequences, scores, metrics)
            sequences = [s for i, s in enumerate(sequences) if i in kept]
            scores = _reindex(scores, sorted(kept))
        metrics["charts/trained_trajectories"] = float(len({s.traj_index for s in sequences}))
        metrics["charts/trained_tokens"] = float(sum(s.num_sampled for s in sequences))
        sampled = self.group.all_gather([s.num_sampled for s in sequences])  # every rank's, for global minibatches
        if any(sampled):
            metrics.update(self._optimize(sequences, scores, sampled, step=step, sft_mode=sft_mode))
            if metrics["charts/optimizer_steps"]:
                self.version += 1  # only weights that changed make a new version (staleness counts real updates)
        summed = [name for name in SUMMED_OVER_RANKS if name in metrics]
        metrics.update(zip(summed, self.group.sum([metrics[name] for name in summed]), strict=True))
        metrics["charts/lr"] = self._lr(step, sft_mode)
        metrics["charts/policy_version"] = float(self.version)
        return metrics

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Every parameter the optimizer updates (LoRA adapters or the unfrozen weights) and the value head.

        Sharded (fsdp2 on several ranks): this rank's DTensor shards; see ``gathered_state``."""
        state = {name: p.detach() for name, p in self.model.named_parameters() if p.requires_grad}
        if self.value_head is not None:
            state.update({f"value_head.{k}": v for k, v in self.value_head.state_dict().items()})
        return state

    def named_trainable_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The optimizer's parameters under their ``trainable_state`` names."""
        out = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
        if self.value_head is not None:
            out += [(f"value_head.{name}", p) for name, p in self.value_head.named_parameters()]
        return out

    def replicated_state(self) -> dict[str, torch.Tensor]:
        """The trainable tensors every rank holds whole (all of them, unless sharded): what ranks compare/broadcast."""
        return {name: t for name, t in self.trainable_state().items() if not fsdp.is_sharded(t)}

    def gathered_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, whole tensor)`` of every trainable tensor, one at a time (a collective when sharded: every rank
        must iterate it to the end, in the same order)."""
        return fsdp.gathered(self.trainable_state())

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict (frozen weights included) as full tensors on CPU, for an export; sharded,
        every rank must call it and each parameter is gathered once, straight to CPU."""
        if not self.sharded:
            return {name: t.detach() for name, t in self.model.state_dict().items()}
        return {name: fsdp.full_tensor(t).detach().cpu() for name, t in self.model.state_dict().items()}

    def nonfinite_names(self) -> list[str]:
        """Trainable tensors with a NaN or infinite entry (any rank's shard counts: the answer is the same on all)."""
        local = [name for name, t in self.trainable_state().items() if not bool(torch.isfinite(fsdp.local(t)).all())]
        if not self.sharded:
            return local
        return sorted({name for part in self.group.all_gather(local) for name in part})

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        expected = self.trainable_state()
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not fit this model/config: missing {missing[:5]}, unexpected {unexpected[:5]}; "
                "resume with the config the run was started with"
            )
        with torch.no_grad():
            for name, tensor in expected.items():
                fsdp.copy_full_into(tensor, state[name])

    # -- internals ---------------------------------------------------------------------------------
    def _staleness(self, traj: Trajectory) -> int:
        versions = [s.policy_version for s in traj.segments if s.num_sampled]
        return self.version - min(versions) if versions else 0

    def _lr(self, step: int, sft_mode: bool) -> float:
        """``lr`` for RL steps (counted from the end of the warm-up) and imitation algorithms (algo=sft);
        ``sft_lr`` in the warm-up."""
        if self.algorithm.imitation:
            return float(self.lr(step))
        if sft_mode:
            return float(self.sft_lr(step))
        return float(self.lr(step - self.config.sft_warmup_steps))

    def _micro_batches(self, sequences: Sequence[TokenSequence]) -> list[list[int]]:
        # Sharded, every rank must make the same decoder calls: the prefix pass would add a second one.
        return plan_micro_batches(sequences, self.config.micro_batch_tokens, share_prefix=not self.sharded)

    @torch.no_grad()
    def _score(self, sequences: list[TokenSequence], scores: _Scores) -> None:
        """The pre-update pass: old logprobs (several optimizer steps per batch), reference logprobs, values."""
        cfg = self.config
        need_old = cfg.epochs_per_batch * cfg.minibatches > 1 or self.algorithm.value_head or cfg.kl == "k1_reward"
        if not (need_old or self.reference is not None):
            return
        self.model.eval()
        for indices in self._collective(self._micro_batches(sequences)):
            if indices is None:  # a rank with fewer micro-batches joins the sharded forwards with a filler
                batch = fsdp.filler_batch(self.pad_id, self.device)
                if need_old:
                    forward(self.graph, batch, value_head=self.value_head, autocast_dtype=self.autocast_dtype)
                if self.reference is not None:
                    with self.reference.model(self.model) as ref_model:
                        forward(self._graph_of(ref_model), batch, autocast_dtype=self.autocast_dtype)
                continue
            batch = collate([sequences[i] for i in indices], self.pad_id, self.device, share_prefix=not self.sharded)
            if need_old:
                out = forward(self.graph, batch, temperature=self._temperature(), value_head=self.value_head,
                              autocast_dtype=self.autocast_dtype)  # fmt: skip
                for i, piece in zip(indices, out.logprobs.split(batch.num_sampled), strict=True):
                    scores.old[i] = piece
                if out.values is not None and out.last_values is not None:
                    for row, (i, piece) in enumerate(zip(indices, out.values.split(batch.num_sampled), strict=True)):
                        scores.values[i] = piece
                        scores.last_value[i] = float(out.last_values[row])
            if self.reference is not None:
                with self.reference.model(self.model) as ref_model:
                    ref = forward(self._graph_of(ref_model), batch, temperature=self._temperature(),
                                  autocast_dtype=self.autocast_dtype)  # fmt: skip
                for i, piece in zip(indices, ref.logprobs.split(batch.num_sampled), strict=True):
                    scores.ref[i] = piece

    def _graph_of(self, model: Any) -> Any:
        """What to run for ``model``: the learner's (sharded) graph, the sharded reference copy, or the model."""
        if model is self.model:
            return self.graph
        if self.ref_graph is not None and model is self.ref_graph.model:
            return self.ref_graph
        return model

    def _collective(self, batches: list[list[int]]) -> list[list[int] | None]:
        """Sharded: the micro-batches padded with fillers (None) to the most any rank runs; else as they are."""
        return fsdp.padded(batches, self.group) if self.sharded else list(batches)

    def _temperature(self) -> float:
        return self.config.rollout.temperature if self.config.rollout.temperature > 0 else 1.0

    def _advantages(
        self, batch: list[Trajectory], sequences: list[TokenSequence], scores: _Scores, metrics: dict[str, float]
    ) -> set[int]:
        """Fill ``scores.advantages`` (and value targets) with the algorithm's advantage function; return the
        indices of the sequences that keep a signal."""
        cfg = self.config
        advantage_fn = self.algorithm.advantages
        assert advantage_fn is not None, "imitation algorithms have no advantages (update takes the sft path)"
        by_traj: dict[int, list[int]] = defaultdict(list)
        for i, s in enumerate(sequences):
            by_traj[s.traj_index].append(i)
        k1 = {}
        if cfg.kl == "k1_reward":
            k1 = {i: kl_k1(scores.old[i], scores.ref[i]) for i in range(len(sequences))}
            total, episodes = self.group.sum([sum(float(v.sum()) for v in k1.values()), len(by_traj)])
            metrics["losses/kl_k1_per_episode"] = total / max(episodes, 1)
        inputs = []
        for t_index, traj in enumerate(batch):
            indices = by_traj[t_index]
            truncated = traj.truncated and not traj.terminated  # a terminated episode bootstraps with 0
            inputs.append(TrajectoryInput(
                reward=traj.reward,
                group_id=traj.group_id,
                sizes=[sequences[i].num_sampled for i in indices],
                kl=[cfg.kl_coef * k1[i] for i in indices] if k1 else [],
                values=[scores.values[i] for i in indices] if self.value_head is not None else [],
                bootstrap_value=scores.last_value[indices[-1]] if truncated and indices and scores.last_value else 0.0,
            ))  # fmt: skip
        result = advantage_fn(inputs, cfg.algo)
        metrics.update(result.metrics)
        filtered = 0
        for t_index, per_token in enumerate(result.per_token):
            if per_token is None:
                continue
            if cfg.overlong_filter and overlong(batch[t_index]):  # counted in its group's mean, trained on by none
                filtered += 1
                continue
            returns = result.returns[t_index] if result.returns is not None else None
            for j, i in enumerate(by_traj[t_index]):
                scores.advantages[i] = per_token[j].to(self.device)
                if returns is not None:
                    scores.returns[i] = returns[j].to(self.device)
        if cfg.overlong_filter:
            metrics["charts/overlong_filtered"] = float(filtered)
        return set(scores.advantages)

    def _optimize(
        self,
        sequences: list[TokenSequence],
        scores: _Scores,
        sampled: list[list[int]],
        *,
        step: int,
        sft_mode: bool,
    ) -> dict[str, float]:
        """Optimizer steps over the global batch: ``sampled[rank]`` = sampled tokens of each sequence of that rank.

        Sequences are numbered as if the ranks' lists were concatenated in rank order, so every rank cuts the same
        minibatches and divides by the same global token count; it runs only its own sequences, and the summed
        gradient is the one-process gradient. Clipping and the step then see identical gradients on every rank.
        """
        cfg = self.config
        offset = sum(len(part) for part in sampled[: self.group.rank])
        tokens_of = [n for part in sampled for n in part]
        stats = _Stats()
        lr = self._lr(step, sft_mode)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        entropy_coef = 0.0 if sft_mode else float(self.entropy_coef(step))
        generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "minibatch", step))
        epochs, minibatches = (1, 1) if sft_mode else (cfg.epochs_per_batch, cfg.minibatches)
        computed = skipped = applied = 0
        self.model.train()
        try:
            for _ in range(epochs):
                order = torch.randperm(len(tokens_of), generator=generator).tolist() if minibatches > 1 else None
                order = order if order is not None else list(range(len(tokens_of)))
                for chunk in (order[k::minibatches] for k in range(minibatches)):
                    if not chunk:
                        continue
                    tokens = sum(tokens_of[i] for i in chunk)
                    mine = [i - offset for i in chunk if offset <= i < offset + len(sequences)]
                    subset = [sequences[i] for i in mine]
                    self.optimizer.zero_grad(set_to_none=True)  # gradients left by anyone else must not leak in
                    finite = True
                    prefix, plan = (plan_step(subset, cfg.micro_batch_tokens) if self.step_prefix and subset
                                    else (0, self._micro_batches(subset)))  # fmt: skip
                    shared = None
                    if prefix:
                        ids = torch.tensor(subset[0].token_ids[:prefix], dtype=torch.long, device=self.device)
                        shared = StepPrefix(self.graph, ids, self.autocast_dtype)
                        computed += prefix
                    for local in self._collective(plan):
                        if local is None:
                            self._filler_step()
                            continue
                        ids = [mine[j] for j in local]
                        done, loss_finite = self._micro_step(
                            sequences, ids, scores, tokens, entropy_coef, sft_mode, stats, shared
                        )
                        computed, finite = computed + done, finite and loss_finite
                    if shared is not None:
                        shared.backward()
                    norm = self._reduce_and_clip()
                    bad_loss = self.group.sum([0.0 if finite else 1.0])[0] > 0  # the same verdict on every rank
                    if bad_loss or not math.isfinite(norm):
                        skipped += 1
                        self._alert_nonfinite(step, norm, bad_loss)
                    else:
                        stats.add_scalar("grad_norm", norm)
                        self.optimizer.step()
                        applied += 1
                    self.optimizer.zero_grad(set_to_none=True)  # no gradient memory held through the rollouts
        finally:
            self.model.eval()
        self.nonfinite_skipped += skipped
        out = {f"losses/{k}": v for k, v in stats.over_ranks(self.group).means().items()}
        out["charts/entropy_coef"] = entropy_coef
        out["charts/forward_tokens"] = float(computed)
        out["charts/nonfinite_skipped"] = float(skipped)
        out["charts/optimizer_steps"] = float(applied)
        return out

    def _reduce_and_clip(self) -> float:
        """Sum the gradients over ranks (FSDP2 already reduce-scattered the sharded ones), clip, return the norm."""
        max_norm = self.config.max_grad_norm or float("inf")
        if self.sharded:
            self.group.all_reduce_gradients([p for p in self.params if not fsdp.is_sharded(p)])
            return fsdp.clip_grad_norm(self.params, max_norm, self.group)
        self.group.all_reduce_gradients(self.params)
        return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))

    def _alert_nonfinite(self, step: int, norm: float, bad_loss: bool) -> None:
        what = "loss" if bad_loss else "gradient"
        logger.warning(
            "ALERT %s: step %d: non-finite %s (grad norm %s): optimizer step skipped, weights and optimizer state "
            "unchanged; look for NaN/inf sampler logprobs, rewards or an lr too high",
            NONFINITE_ALERT, step, what, norm,
        )  # fmt: skip

    def _filler_step(self) -> None:
        """A zero-weight forward/backward that joins the sharded collectives of a rank with no micro-batch left."""
        batch = fsdp.filler_batch(self.pad_id, self.device)
        out = forward(self.graph, batch, value_head=self.value_head, autocast_dtype=self.autocast_dtype)
        loss = out.logprobs.sum() * 0.0
        if out.values is not None and out.last_values is not None:
            loss = loss + (out.values.sum() + out.last_values.sum()) * 0.0
        loss.backward()

    def _micro_step(
        self,
        sequences: list[TokenSequence],
        ids: list[int],
        scores: _Scores,
        total_tokens: int,
        entropy_coef: float,
        sft_mode: bool,
        stats: _Stats,
        shared: StepPrefix | None = None,
    ) -> tuple[int, bool]:
        """Forward and backward one micro-batch; its loss is already divided by the optimizer step's tokens.
        ``shared``: the step's prompt, already run (its gradient is backpropagated once, after the last one).

        Returns (tokens computed, whether the loss was finite)."""
        cfg = self.config
        rows = [sequences[i] for i in ids]
        batch = collate(rows, self.pad_id, self.device, share_prefix=not self.sharded,
                        step_prefix=shared.length if shared is not None else 0)  # fmt: skip
        temperature = 1.0 if sft_mode else self._temperature()
        out = forward(
            self.graph,
            batch,
            temperature=temperature,
            row_temperatures=not sft_mode,  # SFT imitates at temperature 1, whatever the row was sampled at
            entropy=True,
            entropy_grad=entropy_coef > 0,
            value_head=None if sft_mode else self.value_head,
            autocast_dtype=self.autocast_dtype,
            step_prefix=shared,
        )
        logprobs = out.logprobs
        if out.entropy is not None:
            stats.add("entropy", out.entropy)
        if sft_mode:
            per_token, _ = sft.ALGORITHM.token_loss(logprobs, logprobs.detach(), logprobs.detach(), cfg.algo)
            stats.add("sft_nll", per_token)
            loss = per_token.sum() / total_tokens
            loss.backward()
            return batch.computed_tokens, bool(torch.isfinite(loss.detach()))

        def cat(table: dict[int, torch.Tensor]) -> torch.Tensor:
            return torch.cat([table[i] for i in ids]).to(self.device)

        old = cat(scores.old) if scores.old else logprobs.detach()
        advantages = cat(scores.advantages)
        sampler = torch.cat([s.sampler_logprobs for s in rows]).to(self.device)
        per_token, extra = self.algorithm.token_loss(logprobs, old, advantages, cfg.algo)
        stats.add("policy_loss", per_token)
        stats.add("approx_kl", approx_kl(logprobs, old))
        # KL(sampler || learner) by k3 on the sampler's tokens: the inference/training numerics gap (bf16 vs fp32,
        # another engine) plus, for tokens of older versions, the policy lag; the truncated IS weights correct both.
        log_ratio = old.detach() - sampler
        stats.add("mismatch_kl", torch.exp(log_ratio) - 1.0 - log_ratio)
        stats.add("ratio", torch.exp(logprobs.detach() - old))
        for name, values in extra.items():
            stats.add(name, values)
        if scores.ref:
            k3 = kl_k3(logprobs, cat(scores.ref))
            stats.add("kl_ref", k3)
            if cfg.kl == "k3_loss":
                per_token = per_token + cfg.kl_coef * k3
        if entropy_coef > 0 and out.entropy is not None:
            per_token = per_token - entropy_coef * out.entropy
        weights = truncated_is_weights(old, sampler, cfg.is_truncation)
        stats.add("is_weight", weights)
        if cfg.is_truncation > 0:
            stats.add("is_truncated", (weights >= cfg.is_truncation).float())
        loss = (per_token * weights).sum()
        if out.values is not None and self.algorithm.value_loss is not None:
            value_loss = self.algorithm.value_loss(out.values, cat(scores.values), cat(scores.returns), cfg.algo)
            stats.add("value_loss", value_loss)
            loss = loss + value_loss.sum()  # weighted by the algorithm (PPO's vf_coef)
        loss = loss / total_tokens
        loss.backward()
        return batch.computed_tokens, bool(torch.isfinite(loss.detach()))


def _reindex(scores: _Scores, kept: list[int]) -> _Scores:
    """Scores of the kept sequences, renumbered 0..len(kept)-1 like the filtered sequence list."""
    def pick(table: dict[int, Any]) -> dict[int, Any]:
        return {new: table[old] for new, old in enumerate(kept) if old in table}

    out = _Scores()
    out.old, out.ref, out.values = pick(scores.old), pick(scores.ref), pick(scores.values)
    out.last_value, out.advantages, out.returns = pick(scores.last_value), pick(scores.advantages), pick(scores.returns)
    return out
