"""Pieces every policy loss shares: the clipped surrogate, KL estimators, entropy, truncated IS weights.

All functions work on 1-D tensors over the *sampled* tokens of a micro-batch (loss_mask = 1 only) and return
per-token values; the learner weights each token by 1 / (sampled tokens in the optimizer step), so splitting a
batch into micro-batches never changes the gradient. ``approx_kl`` is CleanRL's low-variance estimator.
"""

from __future__ import annotations

from typing import Protocol

import torch

Tensor = torch.Tensor


class ClipRange(Protocol):
    """An algorithm config with a ratio clip range (GRPO's and PPO's)."""

    clip_eps_low: float
    clip_eps_high: float


def clipped_surrogate(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic clipped objective as a per-token loss, and the mask of tokens whose ratio was clipped.

    loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), ratio = exp(logprobs - old_logprobs).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    unclipped, clipped = ratio * advantages, clipped_ratio * advantages
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).detach()  # the min picked the clipped branch: no gradient from it
    return loss, was_clipped


def clipped_policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, clip_eps_low: float, clip_eps_high: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped surrogate (sum it with token weights); stats: ``clipfrac`` (share of tokens whose
    clipped branch was taken)."""
    loss, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, eps_low=clip_eps_low, eps_high=clip_eps_high)
    return loss, {"clipfrac": clipped.float()}


def clipped_token_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, config: ClipRange
) -> tuple[Tensor, dict[str, Tensor]]:
    """``clipped_policy_loss`` with the config's clip range: the token loss GRPO and PPO share."""
    return clipped_policy_loss(
        logprobs, old_logprobs, advantages, clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high
    )


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = log pi - log pi_ref per sampled token (unbiased, high variance): the form folded into rewards."""
    return logprobs - ref_logprobs


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1 >= 0 per sampled token (Schulman): the form added to the loss."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def approx_kl(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """Per-token estimate of KL(old || new) = (ratio - 1) - log ratio, for logging (CleanRL's ``approx_kl``)."""
    log_ratio = (logprobs - old_logprobs).detach()
    return torch.exp(log_ratio) - 1.0 - log_ratio


def truncated_is_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, cap: float) -> Tensor:
    """min(pi_learner_old / pi_sampler, cap) per token, no gradient; ``cap`` <= 0 turns the correction off.

    Corrects for samples drawn by a different policy than the learner's (an async sampler a few versions
    behind, or an inference engine whose numerics differ): without it async runs collapse (NeMo-RL #1098).
    """
    if cap <= 0:
        return torch.ones_like(old_logprobs)
    return torch.exp(old_logprobs.detach() - sampler_logprobs).clamp(max=cap)


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] per row, in float32."""
    logits = logits.float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per row, in float32."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
