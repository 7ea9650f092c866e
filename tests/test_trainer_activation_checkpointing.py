"""Activation checkpointing (``gradient_checkpointing = true``) with the shared-prompt KV path: the same gradients
as without, fewer bytes of activations held between the forward and the backward (measured by ``PeakMemory``, which
counts live tensor storages), and layers really recomputed in the backward pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from taskrl.training.batching import TokenSequence, collate
from taskrl.training.config import config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.memory import PeakMemory
from taskrl.training.model import activation_checkpointing_enabled, decoder_layers, forward, prepare_model
from taskrl.types import Segment, Trajectory

BASE = config_from_dict(
    {"lr": 1e-3, "max_grad_norm": 0.0, "rollout.temperature": 1.0, "progress": False, "rollout.group_size": 4}
)


def _model() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2000, hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _group(prompt_len: int = 48, answer_len: int = 64, rows: int = 4, seed: int = 0) -> list[TokenSequence]:
    """``rows`` answers to one prompt: the micro-batch runs the prompt once (the shared-prefix KV path)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(10, 2000, (prompt_len,), generator=g).tolist()
    out = []
    for row in range(rows):
        answer = torch.randint(10, 2000, (answer_len - 3 * row,), generator=g).tolist()
        ids = prompt + answer
        out.append(TokenSequence(0, ids, list(range(prompt_len, len(ids))), torch.zeros(len(answer)), 0))
    return out


def _backward(model: Any, sequences: list[TokenSequence]) -> tuple[torch.Tensor, dict[str, torch.Tensor], int, int]:
    """Logprobs, gradients, bytes held after the forward (what the backward keeps), and the peak over both."""
    batch = collate(sequences, pad_id=0)
    assert batch.prefix_ids is not None  # the prompt runs once, its KV cache shared by the rows
    model.zero_grad(set_to_none=True)
    model.train()
    with PeakMemory() as memory:
        out = forward(model, batch)
        held = memory.live_bytes
        out.logprobs.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logprobs.detach(), grads, held, memory.peak_bytes


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_same_gradients_and_fewer_activation_bytes(finetune: str) -> None:
    config = BASE.override({"finetune": finetune, "lora.rank": 4})
    plain = prepare_model(_model(), config)
    checkpointed = prepare_model(_model(), config.override({"gradient_checkpointing": True}))
    assert activation_checkpointing_enabled(checkpointed) and not activation_checkpointing_enabled(plain)
    sequences = _group()
    lp_a, grads_a, held_a, peak_a = _backward(plain, sequences)
    lp_b, grads_b, held_b, peak_b = _backward(checkpointed, sequences)
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    # 4 layers x 4 rows x ~60 tokens of attention/MLP activations are not kept; inputs, the KV of the shared prompt
    # and the logits (the LM head is not checkpointed) are.
    assert held_b < 0.6 * held_a, (held_a, held_b)
    assert peak_b < peak_a, (peak_a, peak_b)


def test_layers_rerun_in_the_backward_pass_and_not_without_gradients() -> None:
    model = prepare_model(_model(), BASE.override({"finetune": "full", "gradient_checkpointing": True}))
    calls = []
    for layer in decoder_layers(model):
        # a pre-hook: the recompute stops as soon as the last saved tensor is rebuilt, before the layer returns
        layer.mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    batch = collate(_group(), pad_id=0)
    model.train()
    out = forward(model, batch)
    forwards = len(calls)
    assert forwards == 2 * 4  # the prefix pass and the suffix pass through 4 layers
    out.logprobs.sum().backward()
    assert len(calls) == 2 * forwards  # every layer of both passes recomputed once
    calls.clear()
    with torch.no_grad():  # scoring and generation: no recompute, no checkpoint frames
        forward(model, batch)
    assert len(calls) == forwards


def test_learner_update_with_checkpointing_equals_without() -> None:
    """A whole GRPO update (several micro-batches, prefix sharing, LoRA dropout replayed by the recompute)."""
    trajectories = []
    for g, group in enumerate((_group(seed=1), _group(seed=2))):
        for k, seq in enumerate(group):
            segment = Segment()
            first = seq.first_sampled
            segment.append(seq.token_ids[:first], sampled=False)
            segment.append(seq.token_ids[first:], sampled=True, logprobs=[-7.5] * (len(seq.token_ids) - first))
            trajectories.append(Trajectory(task_id=f"t{g}", group_id=f"g{g}", segments=[segment],
                                           rewards={"r": float(k % 3)}))  # fmt: skip
    weights = []
    for checkpointing in (False, True):
        config = BASE.override({"finetune": "lora", "lora.rank": 4, "lora.dropout": 0.1, "lr": 1e-2,
                                "micro_batch_tokens": 300, "gradient_checkpointing": checkpointing})  # fmt: skip
        torch.manual_seed(3)
        learner = Learner(prepare_model(_model(), config), config, pad_id=0)
        torch.manual_seed(4)  # the dropout masks of the update
        metrics = learner.update(copy.deepcopy(trajectories), step=0)
        assert metrics["charts/optimizer_steps"] == 1 and metrics["charts/trained_tokens"] > 0
        weights.append({k: v.clone() for k, v in learner.trainable_state().items()})
    moved = False
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=1e-5, atol=1e-7, msg=name)
        moved = moved or "lora_B" in name and bool(value.abs().sum() > 0)
    assert moved
