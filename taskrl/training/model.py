"""The learner's view of a causal LM: trainable set-up (LoRA or full), the micro-batch forward, the reference.

``prepare_model`` wraps a transformers model with peft LoRA adapters (or freezes parameters by name for full
fine-tuning) and, with ``gradient_checkpointing``, recomputes each decoder layer in the backward pass;
generation keeps working on the wrapped model, so an ``HFPolicy`` can hold it. ``forward`` runs a
``MicroBatch``: the shared prefix once with a differentiable KV cache, then the suffix rows; the LM head only
at positions that predict sampled tokens (prompt and tool-output logits are never materialised). The caches
are replay-safe (a layer recomputed in the backward pass sees exactly the states of its first run), which is
what lets activation checkpointing and the shared-prompt KV path work together.
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
import torch.utils.checkpoint
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

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
    """LoRA-wrap (``finetune="lora"``) or freeze ``config.freeze`` parameters (full), then checkpoint the decoder
    layers when ``config.gradient_checkpointing``; returns the model to train."""
    model = _trainable(model, config)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model


def _trainable(model: Any, config: TrainConfig) -> Any:
    if config.finetune == "lora":
        if is_peft(model):
            return model  # resumed or prepared by the caller
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise ModelSetupError("finetune='lora' needs peft: pip install 'taskrl[train]'") from None
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [t for t in config.lora.targets if t not in names]
        if missing:
            raise ModelSetupError(
                f"lora.targets {missing} match no module of the model; it has e.g. "
                f"{sorted(n for n in names if n)[:12]}"
            )
        lora = LoraConfig(
            r=config.lora.rank,
            lora_alpha=config.lora.alpha,
            lora_dropout=config.lora.dropout,
            target_modules=list(config.lora.targets),
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


class _CheckpointedForward:
    """A decoder layer's ``forward`` that keeps only its inputs for the backward pass and reruns itself there.

    Installed per instance (``layer.forward``), so module hooks (FSDP2's all-gathers) stay outside the recompute,
    parameter names do not change, and a deep copy of the model (the rollout copy) gets its own wrapper. Without
    gradients (scoring, generation) the layer runs as is. Non-reentrant checkpointing: kwargs pass through, the
    RNG state (LoRA dropout) is replayed, and a recompute that saw different tensors than the first run fails.
    """

    def __init__(self, layer: nn.Module, layer_forward: Any) -> None:
        self.layer = layer
        self.layer_forward = layer_forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and self.layer.training:
            return torch.utils.checkpoint.checkpoint(self.layer_forward, *args, use_reentrant=False, **kwargs)
        return self.layer_forward(*args, **kwargs)


def decoder_layers(model: Any) -> list[nn.Module]:
    """The decoder's transformer blocks (``model.layers`` of a transformers decoder)."""
    try:
        layers = base_model(model).get_decoder().get_submodule("layers")
    except AttributeError:
        layers = None
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ModelSetupError("the model's decoder has no .layers list of blocks; checkpointing/sharding need one")
    return list(layers)


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute every decoder layer in the backward pass instead of keeping its activations (idempotent)."""
    for layer in decoder_layers(model):
        if not isinstance(layer.__dict__.get("forward"), _CheckpointedForward):
            layer.forward = _CheckpointedForward(layer, layer.forward)


def activation_checkpointing_enabled(model: Any) -> bool:
    return any(isinstance(layer.__dict__.get("forward"), _CheckpointedForward) for layer in decoder_layers(model))


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


class _ReplayableCache(DynamicCache):
    """A KV cache whose every ``update`` of a layer starts from the same state, so a recompute replays it exactly.

    HF's cache appends on each call: a layer rerun by activation checkpointing would append its keys a second time
    (and its saved tensors would change shape), which is why transformers drops the cache under checkpointing.
    ``read_only=False`` (the prefix pass): each update of layer i first restores layer i's state from before its
    first update, then stores the new keys (the prefix K/V). ``read_only=True`` (the suffix pass): the update
    returns prefix + new keys and leaves the layer as it was, so nothing but the prefix is ever held.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_only = False
        self._snapshots: dict[int, dict[str, Any]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        if layer_idx < len(self.layers):
            layer = self.layers[layer_idx]
            if self.read_only or layer_idx not in self._snapshots:
                self._snapshots[layer_idx] = dict(layer.__dict__)
            layer.__dict__.update(self._snapshots[layer_idx])
        out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if self.read_only:
            self.layers[layer_idx].__dict__.update(self._snapshots[layer_idx])
        return out

    def frozen_copy(self, rows: int) -> _ReplayableCache:
        """A read-only cache holding this cache's states repeated for ``rows`` rows (this one stays as it is)."""
        out = copy.copy(self)
        out.layers = [copy.copy(layer) for layer in self.layers]
        out.read_only, out._snapshots = False, {}
        out.batch_repeat_interleave(rows)
        out.read_only = True
        return out


class LearnerGraph(nn.Module):
    """What one learner forward runs: the shared prefix (once, into a replay-safe KV cache), the suffix rows, and the
    LM head at the positions that predict sampled tokens. A module of its own so that FSDP2 can make it the root
    unit (embeddings, final norm, head) around the sharded decoder blocks; parameter names stay the model's."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        prefix_ids: torch.Tensor | None,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        rows: torch.Tensor,
        columns: torch.Tensor,
        step_prefix: StepPrefix | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden states [n, S, H], the picked states [N, H], their logits [N, V]).

        ``step_prefix``: ``prefix_ids``' K/V already computed for the whole optimizer step."""
        base = base_model(self.model)
        decoder, head = base.get_decoder(), base.get_output_embeddings()
        kwargs: dict[str, Any] = {}
        if step_prefix is not None:
            kwargs[_cache_kwarg(decoder)] = step_prefix.cache.frozen_copy(input_ids.shape[0])
        elif prefix_ids is not None:
            prefix_cache = _ReplayableCache(config=base.config)
            decoder(input_ids=prefix_ids[None], use_cache=True, **{_cache_kwarg(decoder): prefix_cache})
            kwargs[_cache_kwarg(decoder)] = prefix_cache.frozen_copy(input_ids.shape[0])
        out = decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=bool(kwargs),
            **kwargs,
        )
        hidden = out.last_hidden_state
        picked = hidden[rows, columns]
        return hidden, picked, head(picked)


def forward(
    model: Any,
    batch: MicroBatch,
    *,
    temperature: float = 1.0,
    row_temperatures: bool = True,
    entropy: bool = False,
    entropy_grad: bool = False,
    value_head: nn.Module | None = None,
    autocast_dtype: torch.dtype | None = None,
    step_prefix: StepPrefix | None = None,
) -> ForwardOutput:
    """Logprobs (at ``temperature``) of the batch's sampled tokens, optionally entropies and values.

    Rows that carry their own sampling temperature (``batch.temperatures``, production traffic) are scored at
    it instead, so an unchanged policy reproduces their sampler logprobs; ``row_temperatures=False`` ignores them.

    ``model``: the (peft) causal LM or its ``LearnerGraph`` (the sharded learner passes its root).
    ``autocast_dtype`` (e.g. ``torch.bfloat16``) runs the decoder and LM head under ``torch.autocast`` (weights
    stay in their own dtype: fp32 master weights); logits, logprobs, entropies and values are float32.

    ``step_prefix``: the optimizer step's shared prompt, already run (``batch`` collated with ``step_prefix``).

    Gradients flow when the caller has them enabled; wrap in ``torch.no_grad()`` to score. Entropies carry a
    gradient only with ``entropy_grad`` (an entropy bonus): for logging, the [tokens x vocab] softmax is not
    kept for the backward pass.
    """
    graph = model if isinstance(model, LearnerGraph) else LearnerGraph(model)
    base = base_model(graph.model)
    with _autocast(autocast_dtype, batch.input_ids.device):
        hidden, picked, logits = graph(
            batch.prefix_ids, batch.input_ids, batch.attention_mask, batch.position_ids, batch.rows, batch.columns,
            step_prefix=step_prefix,
        )  # fmt: skip
    # The logprob and loss math runs in float32 whatever the autocast dtype (token_logprobs upcasts too).
    logits = logits.float()
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


def _autocast(dtype: torch.dtype | None, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class StepPrefix:
    """The prompt every row of one optimizer step shares, run once for all its micro-batches.

    Its keys and values enter each micro-batch's forward as leaf tensors: each micro-batch's backward adds its
    gradient into their ``.grad``, and ``backward()`` then runs the prefix pass's own backward once with the sum.
    The step's gradient is the one of a forward of every row with its whole prompt (the suffixes attend to the
    prefix's K/V and backpropagate into them), for one prefix pass per step instead of one per micro-batch.
    """

    def __init__(self, model: Any, prefix_ids: torch.Tensor, autocast_dtype: torch.dtype | None = None) -> None:
        graph = model if isinstance(model, LearnerGraph) else LearnerGraph(model)
        base = base_model(graph.model)
        decoder = base.get_decoder()
        cache = _ReplayableCache(config=base.config)
        with _autocast(autocast_dtype, prefix_ids.device):
            decoder(input_ids=prefix_ids[None], use_cache=True, **{_cache_kwarg(decoder): cache})
        self.length = int(prefix_ids.shape[0])
        self._outputs: list[torch.Tensor] = []
        self._leaves: list[torch.Tensor] = []
        for layer in cache.layers:
            for name in ("keys", "values"):
                out = getattr(layer, name)
                leaf = out.detach().requires_grad_(out.requires_grad)
                setattr(layer, name, leaf)
                self._outputs.append(out)
                self._leaves.append(leaf)
        self.cache = cache

    @staticmethod
    def supported(model: Any) -> bool:
        """Whether the model's KV cache is plain per-layer keys and values (no sliding-window or other state)."""
        base = base_model(model.model if isinstance(model, LearnerGraph) else model)
        try:
            layers = DynamicCache(config=base.config).layers
        except (TypeError, ValueError, AttributeError):
            return False
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    def backward(self) -> None:
        """Backpropagate the micro-batches' summed gradient through the prefix pass (once; a no-op without one)."""
        pairs = [(out, leaf.grad) for out, leaf in zip(self._outputs, self._leaves, strict=True)
                 if out.requires_grad and leaf.grad is not None]  # fmt: skip
        self._outputs, self._leaves = [], []
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])


class Reference:
    """The KL reference policy: the adapter-free base under LoRA, or a frozen copy of the initial weights."""

    def __init__(self, model: Any) -> None:
        self._copy = None if is_peft(model) else copy.deepcopy(model).requires_grad_(False).eval()

    @property
    def copy(self) -> Any:
        """The frozen copy of full fine-tuning (None under LoRA: the base with the adapter disabled)."""
        return self._copy

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
