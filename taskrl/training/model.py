"""The learner's view of a causal LM: trainable set-up (LoRA or full), the micro-batch forward, the reference.

``prepare_model`` wraps a transformers model with peft LoRA adapters (or freezes parameters by name for full
fine-tuning); generation keeps working on the wrapped model, so an ``HFPolicy`` can hold it. ``forward``
runs a ``MicroBatch``: the shared prefix once with a differentiable KV cache, then the suffix rows; the LM
head only at positions that predict sampled tokens (prompt and tool-output logits are never materialised).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from taskrl.algos.losses import token_entropy, token_logprobs
from taskrl.training.batching import MicroBatch
from taskrl.training.config import TrainConfig

ENTROPY_CHUNK_ROWS = 64
"""Rows per chunk of the logging-only entropy (64 x a 49k vocabulary = 12 MB of float32 temporaries)."""


class ModelSetupError(ValueError):
    """The model cannot be prepared as configured (no module matches the LoRA targets, peft missing...)."""


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def prepare_model(model: Any, config: TrainConfig) -> Any:
    """LoRA-wrap (``finetune="lora"``) or freeze ``config.freeze`` parameters (full); returns the model to train."""
    if config.finetune == "lora":
        if is_peft(model):
            return model  # resumed or prepared by the caller
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise ModelSetupError("finetune='lora' needs peft: pip install 'taskrl[train]'") from None
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [t for t in config.lora_targets if t not in names]
        if missing:
            raise ModelSetupError(
                f"TrainConfig.lora_targets {missing} match no module of the model; it has e.g. "
                f"{sorted(n for n in names if n)[:12]}"
            )
        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=list(config.lora_targets),
            bias="none",
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)
    patterns = [re.compile(p) for p in config.freeze]
    for name, param in model.named_parameters():
        param.requires_grad_(not any(p.search(name) for p in patterns))
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelSetupError(f"TrainConfig.freeze {config.freeze} freezes every parameter; nothing would train")
    return model


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (its LoRA layers are injected in place)."""
    return model.get_base_model() if is_peft(model) else model


@dataclass
class ForwardOutput:
    """Per sampled token (flattened in row order) unless noted."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    values: torch.Tensor | None
    last_values: torch.Tensor | None
    """[rows] value of the state after each row's last token (bootstraps truncated episodes)."""


def _cache_kwarg(decoder: nn.Module) -> str:
    # transformers 5 renamed ``past_key_values`` to ``cache``; accept both generations.
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def _cache_of(output: Any) -> Any:
    cache = output.get("cache") if hasattr(output, "get") else None
    return cache if cache is not None else output.past_key_values


def forward(
    model: Any,
    batch: MicroBatch,
    *,
    temperature: float = 1.0,
    row_temperatures: bool = True,
    entropy: bool = False,
    entropy_grad: bool = False,
    value_head: nn.Module | None = None,
) -> ForwardOutput:
    """Logprobs (at ``temperature``) of the batch's sampled tokens, optionally entropies and values.

    Rows that carry their own sampling temperature (``batch.temperatures``, production traffic) are scored at
    it instead, so an unchanged policy reproduces their sampler logprobs; ``row_temperatures=False`` ignores them.

    Gradients flow when the caller has them enabled; wrap in ``torch.no_grad()`` to score. Entropies carry a
    gradient only with ``entropy_grad`` (an entropy bonus): for logging, the [tokens x vocab] softmax is not
    kept for the backward pass.
    """
    base = base_model(model)
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    kwargs: dict[str, Any] = {}
    if batch.prefix_ids is not None:
        prefix_out = decoder(input_ids=batch.prefix_ids[None], use_cache=True)
        cache = _cache_of(prefix_out)
        cache.batch_repeat_interleave(batch.input_ids.shape[0])
        kwargs[_cache_kwarg(decoder)] = cache
    out = decoder(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=batch.prefix_ids is not None,
        **kwargs,
    )
    hidden = out.last_hidden_state
    picked = hidden[batch.rows, batch.columns]
    logits = head(picked)
    softcap = getattr(base.config, "final_logit_softcapping", None)
    if softcap:  # Gemma-2 style heads; without it logprobs would not match the sampler's
        logits = torch.tanh(logits / softcap) * softcap
    if row_temperatures and batch.temperatures is not None:
        per_token = torch.nan_to_num(batch.temperatures, nan=temperature).to(logits.dtype)
        logits = logits / per_token[:, None]
    elif temperature != 1.0:  # x / 1.0 == x exactly: skip a [tokens x vocab] copy
        logits = logits / temperature
    logprobs = token_logprobs(logits, batch.targets)
    ent = None
    if entropy and entropy_grad:
        ent = token_entropy(logits)
    elif entropy:
        with torch.no_grad():
            # A logging-only entropy in row chunks: its softmax temporaries never hold [tokens x vocab] twice.
            ent = torch.cat([token_entropy(rows) for rows in logits.detach().split(ENTROPY_CHUNK_ROWS)])
    values = last_values = None
    if value_head is not None:
        values = value_head(picked.float()).squeeze(-1)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        last_values = value_head(hidden[rows, batch.last_columns].float()).squeeze(-1)
    return ForwardOutput(logprobs, ent, values, last_values)


class Reference:
    """The KL reference policy: the adapter-free base under LoRA, or a frozen copy of the initial weights."""

    def __init__(self, model: Any) -> None:
        self._copy = None if is_peft(model) else copy.deepcopy(model).requires_grad_(False).eval()

    @contextlib.contextmanager
    def model(self, policy_model: Any) -> Iterator[Any]:
        if self._copy is not None:
            yield self._copy
            return
        with policy_model.disable_adapter():
            yield policy_model


def make_value_head(model: Any) -> nn.Module:
    """A linear value head on the last hidden state, zero-initialised (every first value estimate is 0)."""
    hidden = int(base_model(model).config.hidden_size)
    head = nn.Linear(hidden, 1)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head.to(next(model.parameters()).device)
